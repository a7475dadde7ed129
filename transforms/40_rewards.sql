-- rewards: every gen_ai.evaluation.result, sent as a span event or as a log record (the SDK's
-- otel_rl.reward(), POST /v1/rewards, any grader using the GenAI evaluation event).

-- The records with their own fields, before they are placed (which call, which rollout): rewards places
-- them; rollouts reads the outcome records through the same fields.
CREATE OR REPLACE VIEW reward_records AS
WITH span_events AS (
    SELECT s.trace_id, s.span_id, s.rollout_id, s.received_at, s.sender, e.event
    FROM spans s, unnest(json_extract(s.events, '$[*]')) AS e(event)
    -- a cheap text test first, so that only spans carrying the event have their events parsed
    WHERE contains(s.events::VARCHAR, 'gen_ai.evaluation.result')
      AND e.event ->> 'name' = 'gen_ai.evaluation.result'
),
evaluations AS (
    SELECT
        rollout_id,
        trace_id,
        span_id,
        json_extract(event, 'attributes') AS attributes,
        ns_time(TRY_CAST(event ->> 'time_unix_nano' AS UBIGINT)) AS time,
        received_at,
        NULL::UBIGINT AS seq,
        'span_event' AS origin,
        sender
    FROM span_events
    UNION ALL
    SELECT
        rollout_id,
        trace_id,
        span_id,
        attributes,
        ns_time(coalesce(nullif(time_unix_nano, 0), observed_time_unix_nano)) AS time,
        received_at,
        seq,
        'log' AS origin,
        sender
    FROM logs
    WHERE event_name = 'gen_ai.evaluation.result'
)
SELECT
    -- the record's rollout as resolved at ingest (a span event's: its span's); else its span's or trace's
    -- (placed by rewards)
    rollout_id,
    trace_id,
    span_id,
    attributes ->> 'gen_ai.evaluation.name' AS name,
    -- NaN and infinities are refused at ingest; text such as 'inf' stored before that reads as no value
    CASE WHEN isfinite(TRY_CAST(attributes ->> 'gen_ai.evaluation.score.value' AS DOUBLE))
         THEN TRY_CAST(attributes ->> 'gen_ai.evaluation.score.value' AS DOUBLE) END AS value,
    attributes ->> 'gen_ai.evaluation.score.label' AS label,
    attributes ->> 'gen_ai.evaluation.explanation' AS explanation,
    -- NULL when the sender named none: samples trust it only with `--trusted-source any`
    attributes ->> 'otel_rl.reward.source' AS source,
    origin,
    -- the sender's time, for display; "latest" is by the server's receive order (received_at, then seq),
    -- which no sender's clock can move
    time,
    received_at,
    seq,
    -- whether the server vouches for the record's sender (its own components, the admin token's holder):
    -- a source a rollout key's sender names is rewritten to `harness`, but who sent it is this
    vouched(sender) AS vouched
FROM evaluations;

CREATE OR REPLACE VIEW rewards AS
WITH
-- Rewards on a client call span that a gateway row superseded belong to the gateway's llm_calls row.
call_spans AS (
    SELECT trace_id, span_id, rollout_id,
           coalesce(gateway_call.trace_id, trace_id) AS call_trace_id,
           coalesce(gateway_call.span_id, span_id) AS call_span_id
    FROM llm_call_index
),
-- Placed by the one inheritance rule (15_identity.sql): the record's own rollout, else its span's as placed,
-- else its trace's when the trace names one rollout (a log record may name only its trace, or a span not
-- stored yet).
placed AS (
    SELECT r.* REPLACE (coalesce(r.rollout_id, i.rollout_id, t.rollout_id) AS rollout_id)
    FROM reward_records r
    LEFT JOIN span_identity i ON i.trace_id = r.trace_id AND i.span_id = r.span_id
    LEFT JOIN trace_rollouts t ON t.trace_id = r.trace_id
)

SELECT
    r.rollout_id,
    coalesce(c.call_trace_id, r.trace_id) AS trace_id,
    coalesce(c.call_span_id, r.span_id) AS span_id,
    CASE WHEN c.span_id IS NOT NULL THEN 'turn' ELSE 'outcome' END AS level,
    r.name,
    r.value,
    r.label,
    r.explanation,
    r.source,
    r.origin,
    r.time,
    r.received_at,
    r.seq,
    r.vouched
FROM placed r
-- a turn reward only on a call of its own rollout: a record naming one rollout and parented to another's
-- call (a rollout key's, sent with another rollout's span id) stays its own rollout's outcome-level row
LEFT JOIN call_spans c ON c.trace_id = r.trace_id AND c.span_id = r.span_id
    AND c.rollout_id IS NOT DISTINCT FROM r.rollout_id;
