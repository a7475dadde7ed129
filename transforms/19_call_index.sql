-- Which call spans are the rows of llm_calls: each call span with its rollout identity (llm_call_identity)
-- and the row that counts it when it is not one (llm_call_index: gateway supersession, nested duplicates).

-- Every model call span with its rollout identity, error flag and policy version: no content, no dedup.
CREATE OR REPLACE VIEW llm_call_identity AS
SELECT
    *,
    status_code = 2 OR a."error.type" IS NOT NULL OR list_contains(event_names, 'exception') AS is_error,
    -- the policy version is the gateway's word (or the admin's): a harness's span claims none
    CASE WHEN vouched(sender) THEN a."otel_rl.policy.version" END AS policy_version
FROM (
    SELECT
        s.*,
        i.rollout_id,
        i.attempt_id,
        i.group_id,
        i.task_id,
        i.split,
        json_extract_string(s.events, '$[*].name') AS event_names
    FROM llm_call_spans s
    LEFT JOIN span_identity i USING (trace_id, span_id)
);

-- The same with the call that counts each one in its place (dedup, docs/views.md "One call seen twice"):
-- what rollouts and rewards read (much cheaper to plan and to run than llm_call_rows). `gateway_call` is
-- NULL for the rows of llm_calls; for any other call span it names the row that counts the same call:
-- 1. a gateway call supersedes the client's record of it: the call span one to three levels above the
--    gateway span when the trace context was propagated (HTTP client spans may be between: Codex's
--    `model_client.stream_responses_api` is three levels up, and ends when the answer's stream starts), or
--    else a client call of the same rollout whose time range contains the gateway call's; a framework's LLM
--    span around that client span is its duplicate (2.), and so takes the same gateway call;
-- 2. otherwise, call spans nested in one another (a framework's LLM span around the client library's span)
--    are one call seen several times when the nest ends in one innermost call: the most complete record
--    counts (token ids over content over usage; the innermost, closest to the wire, on a tie). A call span
--    around several calls is an aggregate: its innermost calls count;
-- 3. call spans of one trace that name the same response (`gen_ai.response.id`: an SDK's own span beside an
--    instrumentation's, siblings under a third instrumentation's span) are one call: the most complete
--    counts, as in 2., and a nest whose innermost calls are all that one call is no aggregate.
CREATE OR REPLACE VIEW llm_call_index AS
WITH calls AS MATERIALIZED (
    -- Computed once for the rows and for the matches: every reference to a view computes it again, and this
    -- one parses every span's identity and every call span's attributes.
    SELECT * FROM llm_call_identity
),
-- Each call span's parent and grandparent, and a gateway call's great-grandparent.
links AS MATERIALIZED (
    SELECT c.trace_id, c.span_id, c.span_dialect, c.parent_span_id AS a1, p1.parent_span_id AS a2,
           p2.parent_span_id AS a3
    FROM calls c
    LEFT JOIN spans p1 ON p1.trace_id = c.trace_id AND p1.span_id = c.parent_span_id
    LEFT JOIN spans p2
        ON c.span_dialect = 'gateway' AND p2.trace_id = c.trace_id AND p2.span_id = p1.parent_span_id
),
-- (inner call, a call span above it, its level): one equi-join per level
nested AS (
    SELECT l.trace_id, l.span_id, l.span_dialect, o.trace_id AS outer_trace_id, o.span_id AS outer_span_id,
           o.span_dialect AS outer_dialect, 1 AS depth
    FROM links l JOIN calls o ON o.trace_id = l.trace_id AND o.span_id = l.a1
    UNION ALL
    SELECT l.trace_id, l.span_id, l.span_dialect, o.trace_id, o.span_id, o.span_dialect, 2
    FROM links l JOIN calls o ON o.trace_id = l.trace_id AND o.span_id = l.a2
),
gateway_matches AS (
    SELECT trace_id AS client_trace_id, outer_span_id AS client_span_id, trace_id, span_id
    FROM nested
    WHERE span_dialect = 'gateway' AND outer_dialect <> 'gateway'
    UNION ALL
    SELECT o.trace_id, o.span_id, l.trace_id, l.span_id
    FROM links l JOIN calls o ON o.trace_id = l.trace_id AND o.span_id = l.a3
    WHERE l.span_dialect = 'gateway' AND o.span_dialect <> 'gateway'
    UNION ALL
    -- an equi-join on the rollout, then the time test: only calls of one rollout are compared
    SELECT c.trace_id, c.span_id, g.trace_id, g.span_id
    FROM calls c JOIN calls g ON c.rollout_id = g.rollout_id
    WHERE g.span_dialect = 'gateway' AND c.span_dialect <> 'gateway'
      AND c.start_time_unix_nano <= g.start_time_unix_nano AND g.end_time_unix_nano <= c.end_time_unix_nano
),
superseded AS (
    SELECT
        client_trace_id AS trace_id,
        client_span_id AS span_id,
        min({'trace_id': trace_id, 'span_id': span_id}) AS gateway_call
    FROM gateway_matches
    GROUP BY ALL
),
-- Nests of client call spans: each call's outermost call above it (or itself), and whether it is innermost.
-- Without trace propagation between two instrumentations (LangChain's OpenInference spans and the openai
-- client's start separate traces), a client call span of the same rollout whose time range contains the
-- other's, in another trace, is above it.
client_nested AS (
    SELECT trace_id, span_id, outer_trace_id, outer_span_id, depth
    FROM nested WHERE span_dialect <> 'gateway' AND outer_dialect <> 'gateway'
    UNION ALL
    SELECT c.trace_id, c.span_id, o.trace_id, o.span_id, 1
    FROM calls c JOIN calls o ON c.rollout_id = o.rollout_id
    WHERE c.span_dialect <> 'gateway' AND o.span_dialect <> 'gateway' AND c.trace_id <> o.trace_id
      AND o.start_time_unix_nano <= c.start_time_unix_nano AND c.end_time_unix_nano <= o.end_time_unix_nano
),
outer_calls AS (
    SELECT DISTINCT outer_trace_id AS trace_id, outer_span_id AS span_id FROM client_nested
),
-- Client call spans of one trace naming one response: the same call, however their spans are placed.
same_response AS (
    SELECT trace_id, span_id, a."gen_ai.response.id" AS response_id
    FROM calls
    WHERE span_dialect <> 'gateway' AND a."gen_ai.response.id" IS NOT NULL
    QUALIFY count(*) OVER (PARTITION BY trace_id, a."gen_ai.response.id") > 1
),
nest_keys AS (
    SELECT trace_id, span_id FROM client_nested UNION SELECT trace_id, span_id FROM outer_calls
    UNION SELECT trace_id, span_id FROM same_response
),
-- How complete each nested record is: token ids, content, usage. Its span's content is read here, for the
-- nested calls only: the calls above carry no content, so that reads of the index parse none.
completeness AS (
    SELECT
        s.trace_id,
        s.span_id,
        -- false, not NULL, without content: a NULL completeness would sort above every other
        coalesce(contains(s.content_attributes::VARCHAR, '"token_ids"'), false) AS has_token_ids,
        s.content_attributes IS NOT NULL OR contains(s.events::VARCHAR, 'gen_ai.') AS has_content
    FROM spans s SEMI JOIN nest_keys k ON k.trace_id = s.trace_id AND k.span_id = s.span_id
),
nest_members AS (
    SELECT
        c.trace_id,
        c.span_id,
        c.start_time_unix_nano,
        coalesce(o.top, {'trace_id': c.trace_id, 'span_id': c.span_id}) AS top,
        coalesce(o.depth, 0) AS depth,
        u.span_id IS NULL AS innermost,
        4 * q.has_token_ids::INTEGER + 2 * (q.has_content OR e.span_id IS NOT NULL)::INTEGER
            + (coalesce(c.a."gen_ai.usage.input_tokens", c.a."gen_ai.usage.prompt_tokens",
                        c.a."llm.token_count.prompt") IS NOT NULL)::INTEGER AS completeness
    FROM calls c
    JOIN completeness q USING (trace_id, span_id)
    LEFT JOIN (SELECT trace_id, span_id,
                      arg_max({'trace_id': outer_trace_id, 'span_id': outer_span_id}, depth) AS top,
                      max(depth) AS depth
               FROM client_nested GROUP BY ALL) o USING (trace_id, span_id)
    LEFT JOIN outer_calls u USING (trace_id, span_id)
    LEFT JOIN (SELECT DISTINCT trace_id, span_id FROM genai_content_events) e USING (trace_id, span_id)
),
-- Each call's record that counts for its response (3.), or itself.
responses AS (
    SELECT
        m.trace_id,
        m.span_id,
        arg_max({'trace_id': m.trace_id, 'span_id': m.span_id}, (m.completeness, m.depth, m.span_id))
            OVER (PARTITION BY m.trace_id, r.response_id) AS call
    FROM nest_members m JOIN same_response r USING (trace_id, span_id)
),
nests AS (
    SELECT
        top,
        count(DISTINCT coalesce(r.call, {'trace_id': m.trace_id, 'span_id': m.span_id}))
            FILTER (WHERE innermost) AS n_innermost,
        arg_max({'trace_id': m.trace_id, 'span_id': m.span_id}, (completeness, depth)) AS most_complete,
        arg_min(coalesce(r.call, {'trace_id': m.trace_id, 'span_id': m.span_id}), start_time_unix_nano)
            FILTER (WHERE innermost) AS first_innermost
    FROM nest_members m LEFT JOIN responses r USING (trace_id, span_id)
    GROUP BY ALL
),
duplicates AS (
    SELECT
        m.trace_id,
        m.span_id,
        CASE WHEN n.n_innermost = 1 THEN n.most_complete
             WHEN NOT m.innermost THEN n.first_innermost
             ELSE r.call END AS counted_as
    FROM nest_members m JOIN nests n USING (top) LEFT JOIN responses r USING (trace_id, span_id)
)
SELECT
    c.*,
    -- a gateway row is never superseded; a duplicate takes the gateway call of the record that counts
    CASE WHEN c.span_dialect <> 'gateway'
         THEN coalesce(s.gateway_call, ks.gateway_call,
                       CASE WHEN d.counted_as.span_id <> c.span_id THEN d.counted_as END) END AS gateway_call
FROM calls c
LEFT JOIN superseded s USING (trace_id, span_id)
LEFT JOIN duplicates d USING (trace_id, span_id)
LEFT JOIN superseded ks ON ks.trace_id = d.counted_as.trace_id AND ks.span_id = d.counted_as.span_id;
