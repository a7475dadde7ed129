-- llm_calls: one row per model call, whatever the dialect it arrived in (docs/views.md), plus the content
-- log events that could not be joined to a call (unjoined_events).

-- Every attribute a call's columns come from but its content, parsed once per span into a typed struct (each
-- `->>` would parse the whole document again). Typed reads are lenient: a value of another type reads as
-- NULL. Content attributes are in spans.content_attributes (schema.sql), parsed only for the columns that
-- need them (messages, tool definitions, OpenInference's request and response bodies).
CREATE OR REPLACE MACRO call_attributes_of(attributes) AS from_json(attributes, '{
    "gen_ai.operation.name": "VARCHAR", "openinference.span.kind": "VARCHAR",
    "gen_ai.provider.name": "VARCHAR", "gen_ai.system": "VARCHAR",
    "llm.system": "VARCHAR", "llm.provider": "VARCHAR",
    "gen_ai.request.model": "VARCHAR", "gen_ai.response.model": "VARCHAR", "llm.model_name": "VARCHAR",
    "gen_ai.response.finish_reasons": "JSON",
    "llm.finish_reason": "VARCHAR",
    "gen_ai.request.temperature": "DOUBLE", "gen_ai.request.top_p": "DOUBLE",
    "gen_ai.request.max_tokens": "INTEGER",
    "gen_ai.request.seed": "BIGINT", "gen_ai.openai.request.seed": "BIGINT",
    "gen_ai.request.choice.count": "INTEGER", "gen_ai.request.n": "INTEGER",
    "gen_ai.request.stream": "BOOLEAN", "gen_ai.is_streaming": "BOOLEAN",
    "gen_ai.usage.input_tokens": "INTEGER", "gen_ai.usage.prompt_tokens": "INTEGER",
    "gen_ai.usage.output_tokens": "INTEGER", "gen_ai.usage.completion_tokens": "INTEGER",
    "llm.token_count.prompt": "INTEGER", "llm.token_count.completion": "INTEGER",
    "gen_ai.usage.cache_read.input_tokens": "INTEGER", "llm.token_count.prompt_details.cache_read": "INTEGER",
    "llm.invocation_parameters": "VARCHAR",
    "error.type": "VARCHAR", "gen_ai.openai.api_base": "VARCHAR",
    "server.address": "VARCHAR", "server.port": "INTEGER",
    "otel_rl.policy.version": "INTEGER", "otel_rl.sampling.params": "VARCHAR",
    "otel_rl.server.url": "VARCHAR"}');

-- The latest semconv content of a call: a span's content_attributes, or an operation-details log record's
-- attributes. Read as text, whether sent as a JSON string (spans) or structured (log records), then read
-- with TRY_CAST(... AS JSON): one parse, and invalid JSON gives NULL rather than breaking every query.
CREATE OR REPLACE MACRO semconv_content_of(attributes) AS from_json(attributes, '{
    "gen_ai.input.messages": "VARCHAR", "gen_ai.output.messages": "VARCHAR",
    "gen_ai.system_instructions": "VARCHAR", "gen_ai.tool.definitions": "VARCHAR"}');

-- Spans that are model calls: GenAI inference spans (every semconv library and the gateway) and
-- OpenInference LLM spans. Agent, tool and embedding spans are not calls.
CREATE OR REPLACE VIEW llm_call_spans AS
SELECT
    trace_id,
    span_id,
    parent_span_id,
    name,
    start_time_unix_nano,
    end_time_unix_nano,
    status_code,
    events,
    attributes,
    content_attributes,
    resource_attributes,
    scope_name,
    a,
    CASE
        WHEN scope_name = 'otel_rl.gateway' THEN 'gateway'
        WHEN a."openinference.span.kind" = 'LLM' THEN 'openinference'
        ELSE 'semconv'  -- refined in llm_call_rows with the content events that joined
    END AS span_dialect
FROM (
    SELECT *, call_attributes_of(attributes) AS a
    FROM spans
    -- a text test first, then one parse of the two keys: only call spans have their attributes parsed whole
    WHERE (contains(attributes::VARCHAR, 'gen_ai.operation.name')
           OR contains(attributes::VARCHAR, 'openinference.span.kind'))
      AND list_has_any(
          json_extract_string(attributes, ['$."gen_ai.operation.name"', '$."openinference.span.kind"']),
          ['chat', 'text_completion', 'generate_content', 'LLM'])
)
-- OpenInference marks every request of the openai client LLM, `client.models.list()` too: those name no
-- model, and are not calls.
WHERE a."openinference.span.kind" IS DISTINCT FROM 'LLM'
   OR a."llm.model_name" IS NOT NULL
   OR json_extract_string(a."llm.invocation_parameters", '$.model') IS NOT NULL;

-- Log records that carry a call's content: the legacy per-message events (official v2 legacy path,
-- Traceloop with use_attributes=False) and the latest semconv operation-details record (util-genai
-- event_only / span_and_event).
CREATE OR REPLACE VIEW genai_content_events AS
SELECT
    *,
    CASE event_name
        WHEN 'gen_ai.client.inference.operation.details' THEN 'semconv_event'
        ELSE 'legacy_events'
    END AS event_dialect
FROM logs
WHERE event_name IN (
    'gen_ai.system.message', 'gen_ai.user.message', 'gen_ai.assistant.message', 'gen_ai.tool.message',
    'gen_ai.choice', 'gen_ai.client.inference.operation.details'
);

-- Content events with no call span to join to, counted rather than dropped: records sent without a span
-- context (Traceloop's streaming gen_ai.choice is emitted after its span ended) and records whose span is
-- not (yet) stored. Time-based guessing is deliberately not attempted.
CREATE OR REPLACE VIEW unjoined_events AS
SELECT
    e.content_key,
    e.seq,
    e.event_name,
    e.trace_id,
    e.span_id,
    CASE WHEN e.span_id IS NULL THEN 'no_span_context' ELSE 'call_span_not_stored' END AS reason,
    ns_time(coalesce(nullif(e.time_unix_nano, 0), e.observed_time_unix_nano)) AS time,
    e.body,
    e.resource_attributes ->> 'service.name' AS service_name,
    e.scope_name
FROM genai_content_events e
ANTI JOIN llm_call_spans s ON s.trace_id = e.trace_id AND s.span_id = e.span_id;

-- The content events of each call, in record order: legacy input messages by seq, legacy choices by index,
-- and the latest operation-details record's attributes. The counts decide the dialect without building
-- the lists, so that queries not reading messages skip that work.
CREATE OR REPLACE VIEW llm_call_events AS
SELECT
    trace_id,
    span_id,
    count(*) FILTER (WHERE event_dialect = 'legacy_events') AS n_legacy_events,
    count(*) FILTER (WHERE event_dialect = 'semconv_event') AS n_details_events,
    list(openai_message(message, role) ORDER BY seq)
        FILTER (WHERE event_dialect = 'legacy_events' AND event_name <> 'gen_ai.choice') AS legacy_input,
    list(openai_output_message(choice) ORDER BY TRY_CAST(body ->> 'index' AS INTEGER), seq)
        FILTER (WHERE event_name = 'gen_ai.choice') AS legacy_output,
    arg_max(attributes, seq) FILTER (WHERE event_dialect = 'semconv_event') AS details
FROM (
    -- Parsed here, not in the macro calls: a macro copies its argument into every place that uses it, and
    -- binding (planning) the copies of a parse costs more than running it.
    SELECT
        *,
        openai_message_of(body) AS message,
        regexp_extract(event_name, '^gen_ai\.(\w+)\.message$', 1) AS role,
        openai_choice_of(body) AS choice
    FROM genai_content_events
    WHERE span_id IS NOT NULL
)
GROUP BY trace_id, span_id;

-- Every model call span with its rollout identity, error flag and policy version: no content, no dedup.
CREATE OR REPLACE VIEW llm_call_identity AS
SELECT
    *,
    status_code = 2 OR a."error.type" IS NOT NULL OR list_contains(event_names, 'exception') AS is_error,
    a."otel_rl.policy.version" AS policy_version
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

-- The same with each call's superseding gateway call (dedup, PLAN.md): what rollouts and rewards read (much
-- cheaper to plan and to run than llm_call_rows). A call recorded both by the gateway and by the client's
-- instrumentation keeps only the gateway row. The client call span is the gateway call span's parent or
-- grandparent when the trace context was propagated, or else a client call of the same rollout whose time
-- range contains the gateway call's.
CREATE OR REPLACE VIEW llm_call_index AS
WITH calls AS MATERIALIZED (
    -- Computed once for the rows and for the matches: every reference to a view computes it again, and this
    -- one parses every span's identity and every call span's attributes.
    SELECT * FROM llm_call_identity
),
gateway_calls AS (
    SELECT trace_id, span_id, parent_span_id, start_time_unix_nano, end_time_unix_nano, rollout_id
    FROM calls
    WHERE span_dialect = 'gateway'
),
matches AS (
    SELECT g.trace_id AS client_trace_id, g.parent_span_id AS client_span_id, g.trace_id, g.span_id
    FROM gateway_calls g
    UNION ALL
    SELECT g.trace_id, p.parent_span_id, g.trace_id, g.span_id
    FROM gateway_calls g JOIN spans p ON p.trace_id = g.trace_id AND p.span_id = g.parent_span_id
    UNION ALL
    -- an equi-join on the rollout, then the time test: only calls of one rollout are compared
    SELECT c.trace_id, c.span_id, g.trace_id, g.span_id
    FROM calls c JOIN gateway_calls g ON c.rollout_id = g.rollout_id
    WHERE c.span_dialect <> 'gateway'
      AND c.start_time_unix_nano <= g.start_time_unix_nano AND g.end_time_unix_nano <= c.end_time_unix_nano
),
superseded AS (
    SELECT
        client_trace_id AS trace_id,
        client_span_id AS span_id,
        min({'trace_id': trace_id, 'span_id': span_id}) AS gateway_call
    FROM matches
    GROUP BY ALL
)
SELECT
    c.*,
    -- a gateway row is never superseded
    CASE WHEN c.span_dialect <> 'gateway' THEN s.gateway_call END AS gateway_call
FROM calls c
LEFT JOIN superseded s USING (trace_id, span_id);

-- Each superseded client call span and its gateway call.
CREATE OR REPLACE VIEW llm_call_superseded AS
SELECT trace_id, span_id, gateway_call
FROM llm_call_index
WHERE gateway_call IS NOT NULL;

-- Every model call row, including client rows that a gateway row supersedes.
CREATE OR REPLACE VIEW llm_call_rows AS
WITH calls AS (
    SELECT
        s.*,
        e.legacy_input,
        e.legacy_output,
        t.prompt_token_ids AS gw_prompt_token_ids,
        t.choice_token_ids AS gw_choice_token_ids,
        t.choice_logprobs AS gw_choice_logprobs,
        e.n_details_events,
        e.n_legacy_events,
        e.details,
        -- Content is parsed only for the columns that read it, and per dialect (CASE evaluates a branch for
        -- the rows that take it): semconv messages on the span (a semconv span's dialect depends on them),
        -- or OpenInference's raw OpenAI request and response bodies.
        CASE WHEN s.span_dialect = 'semconv' THEN semconv_content_of(s.content_attributes) END
            AS span_content,
        CASE WHEN s.span_dialect = 'openinference'
             THEN try(oi_request_of(s.content_attributes ->> 'input.value')) END AS oi_request,
        CASE WHEN s.span_dialect = 'openinference'
             THEN try(oi_response_of(s.content_attributes ->> 'output.value')) END AS oi_response,
        try(json(s.a."llm.invocation_parameters")) AS oi_params
    FROM llm_call_index s
    LEFT JOIN llm_call_events e USING (trace_id, span_id)
    LEFT JOIN call_tokens t USING (trace_id, span_id)
),

sourced AS (
    SELECT
        *,
        -- The dialect a call's content came in: span attributes win over log events, so that
        -- span_and_event is not counted twice.
        CASE
            WHEN span_dialect <> 'semconv' THEN span_dialect
            WHEN span_content."gen_ai.input.messages" IS NOT NULL
                 OR span_content."gen_ai.output.messages" IS NOT NULL
            THEN 'semconv'
            WHEN n_details_events > 0 THEN 'semconv_event'
            WHEN n_legacy_events > 0 THEN 'legacy_events'
            ELSE 'semconv'
        END AS dialect,
        -- Where semconv content is: on the span, or (event_only) on its operation-details record.
        CASE WHEN span_dialect = 'gateway' THEN semconv_content_of(content_attributes)
             WHEN span_content."gen_ai.input.messages" IS NULL
                  AND span_content."gen_ai.output.messages" IS NULL
                  AND details IS NOT NULL
             THEN semconv_content_of(details) ELSE span_content END AS content,
        -- normalized, one per choice where the library wrote them all
        [finish_reason(r) FOR r IN coalesce(
            nullif(json_extract_string(json_doc(a."gen_ai.response.finish_reasons"), '$[*]'), []),
            nullif([c.finish_reason FOR c IN oi_response.choices], []),
            CASE WHEN a."llm.finish_reason" IS NOT NULL THEN [a."llm.finish_reason"] END
        )] AS attribute_finish_reasons,
        coalesce(a."gen_ai.request.choice.count", a."gen_ai.request.n",
                 TRY_CAST(oi_params ->> 'n' AS INTEGER)) AS requested_choices,
        -- a column, not error_type_name's argument: the macro uses its argument four times
        coalesce(
            a."error.type",
            [json_extract(ev, 'attributes') ->> 'exception.type'
                FOR ev IN json_extract(events, '$[*]') IF ev ->> 'name' = 'exception'][1]
        ) AS raw_error_type
    FROM calls
),

normalized AS (
    SELECT
        trace_id,
        span_id,
        parent_span_id,
        rollout_id,
        attempt_id,
        group_id,
        task_id,
        split,
        start_time_unix_nano,
        end_time_unix_nano,
        dialect,
        CASE WHEN span_dialect = 'openinference'
             THEN CASE WHEN oi_request.prompt IS NOT NULL AND oi_request.messages IS NULL
                       THEN 'text_completion' ELSE 'chat' END
             ELSE a."gen_ai.operation.name" END AS operation,
        coalesce(a."gen_ai.provider.name", a."gen_ai.system", a."llm.system", a."llm.provider") AS provider,
        -- OpenInference's opt-in gen_ai.request.model holds the response model: read the request's model
        -- first: its invocation parameters (a small document), else the request body.
        CASE WHEN span_dialect = 'openinference'
             THEN coalesce(oi_params ->> 'model', oi_request.model, a."gen_ai.request.model")
             ELSE a."gen_ai.request.model" END AS request_model,
        -- As sent: Traceloop strips the "org/" prefix ("Qwen3-0.6B"), the others keep it.
        coalesce(a."gen_ai.response.model", oi_response.model, a."llm.model_name") AS response_model,

        CASE dialect
            WHEN 'openinference' THEN
                CASE WHEN oi_request.messages IS NOT NULL
                     THEN [openai_message(m, NULL) FOR m IN oi_request.messages]
                     -- [] when none: the final SELECT makes it NULL (a nullif here would plan it twice)
                     ELSE oi_messages(content_attributes, 'llm.input_messages.') END
            WHEN 'legacy_events' THEN legacy_input
            ELSE semconv_input_messages(TRY_CAST(content."gen_ai.input.messages" AS JSON),
                                        TRY_CAST(content."gen_ai.system_instructions" AS JSON))
        END AS input_messages_list,
        CASE dialect
            WHEN 'openinference' THEN
                CASE WHEN oi_response.choices IS NOT NULL
                     THEN [openai_output_message(c) FOR c IN oi_response.choices]
                     -- llm.finish_reason is the first choice's only; [] when none, as above
                     ELSE list_transform(oi_messages(content_attributes, 'llm.output_messages.'),
                                         lambda m, i: with_finish_reason(
                                             m, CASE WHEN i = 1 THEN a."llm.finish_reason" END)) END
            WHEN 'legacy_events' THEN legacy_output
            ELSE semconv_output_messages(TRY_CAST(content."gen_ai.output.messages" AS JSON))
        END AS output_messages_list,
        -- The finish reason of each output message, read without building the messages. The gateway writes
        -- one per choice in gen_ai.response.finish_reasons too: its message content is not parsed for them.
        CASE
            WHEN span_dialect = 'gateway' AND list_bool_or([r IS NOT NULL FOR r IN attribute_finish_reasons])
            THEN attribute_finish_reasons
            WHEN dialect = 'openinference' THEN
                CASE WHEN oi_response.choices IS NOT NULL
                     THEN [finish_reason(c.finish_reason) FOR c IN oi_response.choices]
                     -- [] when none, read as none below
                     ELSE [CASE WHEN i = 0 THEN finish_reason(a."llm.finish_reason") END
                           FOR i IN range(oi_count(content_attributes, 'llm.output_messages.'))] END
            WHEN dialect = 'legacy_events' THEN [m.finish_reason FOR m IN legacy_output]
            ELSE [finish_reason(r)
                  FOR r IN json_extract_string(TRY_CAST(content."gen_ai.output.messages" AS JSON),
                                               '$[*].finish_reason')]
        END AS output_finish_reasons,
        attribute_finish_reasons,
        requested_choices,
        CASE dialect
            WHEN 'openinference' THEN coalesce(oi_request.tools, oi_tool_definitions(content_attributes))
            ELSE openai_tool_definitions(TRY_CAST(content."gen_ai.tool.definitions" AS JSON))
        END AS tool_definitions,
        coalesce(a."gen_ai.request.temperature",
                 TRY_CAST(oi_params ->> 'temperature' AS DOUBLE)) AS temperature,
        coalesce(a."gen_ai.request.top_p", TRY_CAST(oi_params ->> 'top_p' AS DOUBLE)) AS top_p,
        coalesce(a."gen_ai.request.max_tokens", TRY_CAST(oi_params ->> 'max_tokens' AS INTEGER),
                 TRY_CAST(oi_params ->> 'max_completion_tokens' AS INTEGER)) AS max_tokens,
        coalesce(a."gen_ai.request.seed", a."gen_ai.openai.request.seed",
                 TRY_CAST(oi_params ->> 'seed' AS BIGINT)) AS seed,
        coalesce(a."gen_ai.usage.input_tokens", a."gen_ai.usage.prompt_tokens", a."llm.token_count.prompt")
            AS input_tokens,
        coalesce(a."gen_ai.usage.output_tokens", a."gen_ai.usage.completion_tokens",
                 a."llm.token_count.completion") AS output_tokens,
        coalesce(a."gen_ai.usage.cache_read.input_tokens", a."llm.token_count.prompt_details.cache_read")
            AS cache_read_tokens,

        -- Only some libraries say whether a call streamed; the official v2 never does (NULL: unknown).
        coalesce(
            a."gen_ai.request.stream",
            a."gen_ai.is_streaming",
            CASE WHEN span_dialect = 'openinference'
                 THEN coalesce(TRY_CAST(oi_params ->> 'stream' AS BOOLEAN), false) END,
            CASE WHEN list_contains(event_names, 'gen_ai.content.completion.chunk') THEN true END
        ) AS streaming,

        is_error,
        error_type_name(raw_error_type) AS error_type,

        -- Token data: the gateway's packed arrays, or the raw vLLM response that OpenInference keeps.
        CASE WHEN span_dialect = 'gateway' THEN gw_prompt_token_ids ELSE oi_response.prompt_token_ids END
            AS prompt_token_ids,
        CASE WHEN span_dialect = 'gateway' THEN gw_choice_token_ids
             ELSE [c.token_ids FOR c IN oi_response.choices] END AS completion_token_ids_raw,
        CASE WHEN span_dialect = 'gateway' THEN gw_choice_logprobs
             ELSE [[t.logprob FOR t IN c.logprobs.content] FOR c IN oi_response.choices] END
            AS completion_logprobs_raw,

        policy_version,
        CASE span_dialect
            WHEN 'gateway' THEN try(json(a."otel_rl.sampling.params"))
            WHEN 'openinference' THEN oi_params
        END AS sampling_params,
        coalesce(a."otel_rl.server.url", a."gen_ai.openai.api_base",
                 a."server.address" || coalesce(':' || a."server.port", '')) AS server_url,
        resource_attributes ->> 'service.name' AS service_name,
        scope_name,
        gateway_call
    FROM sourced
)

SELECT
    c.trace_id,
    c.span_id,
    c.parent_span_id,
    c.rollout_id,
    c.attempt_id,
    c.group_id,
    c.task_id,
    c.split,
    ns_time(c.start_time_unix_nano) AS started_at,
    ns_time(c.end_time_unix_nano) AS ended_at,
    c.start_time_unix_nano,
    -- the collector stores an end before the start as the start; rows stored before it did read as 0
    (greatest(c.end_time_unix_nano, c.start_time_unix_nano) - c.start_time_unix_nano) / 1e6 AS duration_ms,
    c.operation,
    c.provider,
    c.request_model,
    c.response_model,
    to_json(nullif(c.input_messages_list, [])) AS input_messages,
    to_json(nullif(c.output_messages_list, [])) AS output_messages,
    c.tool_definitions,
    coalesce(len(nullif(c.output_finish_reasons, [])), len(c.attribute_finish_reasons),
             c.requested_choices)::INTEGER AS n_choices,
    -- One per choice: from the output messages when they carry them, else the span attribute (streamed
    -- official-v2 calls have them only in the messages; OpenInference's attribute has the first choice's
    -- only).
    CASE WHEN list_bool_or([r IS NOT NULL FOR r IN c.output_finish_reasons]) THEN c.output_finish_reasons
         WHEN list_bool_or([r IS NOT NULL FOR r IN c.attribute_finish_reasons])
         THEN c.attribute_finish_reasons
    END AS finish_reasons,
    c.temperature,
    c.top_p,
    c.max_tokens,
    c.seed,
    c.input_tokens,
    c.output_tokens,
    c.cache_read_tokens,
    c.streaming,
    c.is_error,
    c.error_type,
    c.dialect,
    c.prompt_token_ids,
    CASE WHEN list_bool_or([t IS NOT NULL FOR t IN c.completion_token_ids_raw])
         THEN c.completion_token_ids_raw END AS completion_token_ids,
    CASE WHEN list_bool_or([l IS NOT NULL FOR l IN c.completion_logprobs_raw])
         THEN c.completion_logprobs_raw END AS completion_logprobs,
    c.policy_version,
    c.sampling_params,
    c.server_url,
    c.service_name,
    c.scope_name,
    c.gateway_call.trace_id AS superseded_by_trace_id,
    c.gateway_call.span_id AS superseded_by_span_id
FROM normalized c;

-- One row per model call (PLAN.md contract): client rows superseded by a gateway row are left out.
CREATE OR REPLACE VIEW llm_calls AS
SELECT * EXCLUDE (superseded_by_trace_id, superseded_by_span_id)
FROM llm_call_rows
WHERE superseded_by_span_id IS NULL;

-- The llm_calls columns that turn gateway calls into training samples, read without normalizing any content:
-- one row per gateway row of llm_calls, with the same values (tests/test_samples_export.py checks it), at a
-- fraction of the cost. Finish reasons come from gen_ai.response.finish_reasons, which the gateway writes
-- (one per choice, "" for none) with its output messages. The samples pipeline reads other dialects from
-- llm_calls.
CREATE OR REPLACE VIEW gateway_call_tokens AS
SELECT
    s.trace_id,
    s.span_id,
    s.rollout_id,
    s.attempt_id,
    s.group_id,
    s.task_id,
    s.split,
    s.start_time_unix_nano,
    s.is_error,
    CASE WHEN list_bool_or([r IS NOT NULL FOR r IN s.finish_reasons]) THEN s.finish_reasons END
        AS finish_reasons,
    t.prompt_token_ids,
    CASE WHEN list_bool_or([c IS NOT NULL FOR c IN t.choice_token_ids]) THEN t.choice_token_ids END
        AS completion_token_ids,
    CASE WHEN list_bool_or([l IS NOT NULL FOR l IN t.choice_logprobs]) THEN t.choice_logprobs END
        AS completion_logprobs,
    s.policy_version
FROM (
    SELECT
        *,
        [finish_reason(r) FOR r IN json_extract_string(json_doc(a."gen_ai.response.finish_reasons"), '$[*]')]
            AS finish_reasons
    FROM llm_call_identity  -- gateway rows are never superseded
    WHERE span_dialect = 'gateway'
) s
LEFT JOIN call_tokens t USING (trace_id, span_id);
