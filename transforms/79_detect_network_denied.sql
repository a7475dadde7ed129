-- detect_network_denied: something in the rollout's sandbox tried to reach what its network does not forward
-- (an address outside, another port of the host's loopback, a DNS name). The sandbox's network denies it and
-- records it (otel_rl/coding/forward.py): one `otel_rl.sandbox.denied_connect` event per attempt on the
-- controller's `otel_rl.rollout` span, from a sender the server vouches for, never the agent's process
-- (docs/coding.md "The sandbox's network"). Whatever tool (or none the telemetry shows) made the attempt.

CREATE OR REPLACE VIEW detect_network_denied AS
WITH rollout_spans AS (
    SELECT trace_id, span_id, rollout_id, events
    FROM spans
    WHERE scope_name = 'otel_rl.controller' AND name = 'otel_rl.rollout' AND vouched(sender)
      -- a cheap text test first: only the spans of rollouts with denied attempts have their events read
      AND contains(events::VARCHAR, 'otel_rl.sandbox.denied_connect')
),
denied AS (
    SELECT trace_id, span_id, rollout_id, unnest(json_extract(events, '$[*]')) AS event
    FROM rollout_spans
)
SELECT
    rollout_id,
    'network_denied' AS detector,
    span_id AS evidence_id,
    CASE
        WHEN event -> 'attributes' ->> 'dns.question.name' IS NOT NULL
            THEN 'dns ' || (event -> 'attributes' ->> 'dns.question.name')
        WHEN contains(event -> 'attributes' ->> 'server.address', ':')  -- IPv6: [address]:port
            THEN format('{} [{}]:{}', event -> 'attributes' ->> 'network.transport',
                        event -> 'attributes' ->> 'server.address', event -> 'attributes' ->> 'server.port')
        ELSE format('{} {}:{}', event -> 'attributes' ->> 'network.transport',
                    event -> 'attributes' ->> 'server.address', event -> 'attributes' ->> 'server.port')
    END AS evidence,
    trace_id,
    span_id
FROM denied
WHERE rollout_id IS NOT NULL AND event ->> 'name' = 'otel_rl.sandbox.denied_connect';
