-- llm_calls: one row per model call, whatever the dialect it arrived in (docs/views.md).

-- Every model call row, including the call spans another row counts (superseded_by_*: see llm_call_index).
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
        -- frameworks' OpenInference spans: input.value / output.value as lists of chat messages
        CASE WHEN s.span_dialect = 'openinference'
                  AND starts_with(s.content_attributes ->> 'input.value', '[')
             THEN try(oi_message_list_of(s.content_attributes ->> 'input.value')) END AS oi_input_list,
        CASE WHEN s.span_dialect = 'openinference'
                  AND starts_with(s.content_attributes ->> 'output.value', '[')
             THEN try(oi_message_list_of(s.content_attributes ->> 'output.value')) END AS oi_output_list,
        try(json(s.a."llm.invocation_parameters")) AS oi_params,
        CASE WHEN s.span_dialect = 'logfire' THEN try(oi_message_list_of(s.attributes ->> 'input')) END
            AS logfire_input,
        CASE WHEN s.span_dialect = 'logfire' THEN try(responses_of(s.attributes ->> 'output')) END
            AS logfire_output,
        CASE WHEN s.span_dialect = 'haystack'
             THEN try(haystack_messages_of(json_extract(s.content_attributes ->> 'haystack.component.input',
                                                        '$.messages'))) END AS haystack_input,
        CASE WHEN s.span_dialect = 'haystack'
             THEN try(haystack_messages_of(json_extract(s.content_attributes ->> 'haystack.component.output',
                                                        '$.replies'))) END AS haystack_output,
        -- operation-details records sent as span events (Strands with the latest semconv), merged
        CASE WHEN s.span_dialect = 'semconv'
                  AND contains(s.events::VARCHAR, 'gen_ai.client.inference.operation.details')
             THEN semconv_content_of(list_reduce(
                 [json_extract(ev, '$.attributes') FOR ev IN json_extract(s.events, '$[*]')
                  IF ev ->> 'name' = 'gen_ai.client.inference.operation.details'],
                 lambda x, y: json_merge_patch(x, y))) END AS event_details,
        -- content as span events (Strands Agents), parsed once
        CASE WHEN s.span_dialect = 'semconv' AND contains(s.events::VARCHAR, '"gen_ai.')
             THEN span_content_events_of(s.events) END AS span_events
    FROM llm_call_index s
    LEFT JOIN llm_call_events e USING (trace_id, span_id)
    -- the span's own sender's token ids: never a harness's sent with the ids of the gateway's span
    LEFT JOIN call_tokens t ON t.trace_id = s.trace_id AND t.span_id = s.span_id AND t.sender = s.sender
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
            WHEN n_details_events > 0 OR event_details IS NOT NULL THEN 'semconv_event'
            WHEN n_legacy_events > 0 THEN 'legacy_events'
            WHEN len(span_events) > 0 THEN 'span_events'
            ELSE 'semconv'
        END AS dialect,
        -- Where semconv content is: on the span, or (event_only) on its operation-details record.
        CASE WHEN span_dialect = 'gateway' THEN semconv_content_of(content_attributes)
             WHEN span_content."gen_ai.input.messages" IS NULL
                  AND span_content."gen_ai.output.messages" IS NULL
                  AND details IS NOT NULL
             THEN semconv_content_of(details)
             WHEN span_content."gen_ai.input.messages" IS NULL
                  AND span_content."gen_ai.output.messages" IS NULL
             THEN coalesce(event_details, span_content)
             ELSE span_content END AS content,
        -- normalized, one per choice where the library wrote them all
        [finish_reason(r) FOR r IN coalesce(
            nullif(json_extract_string(json_doc(a."gen_ai.response.finish_reasons"), '$[*]'), []),
            nullif([c.finish_reason FOR c IN oi_response.choices], []),
            CASE WHEN a."llm.finish_reason" IS NOT NULL THEN [a."llm.finish_reason"] END,
            CASE WHEN a."ai.response.finishReason" IS NOT NULL THEN [a."ai.response.finishReason"] END
        )] AS attribute_finish_reasons,
        coalesce(a."gen_ai.request.choice.count", a."gen_ai.request.n",
                 TRY_CAST(oi_params ->> 'n' AS INTEGER)) AS requested_choices,
        -- LiteLLM's legacy flattened answer attributes, read only where present (a `->>` parses the whole
        -- document each time)
        CASE WHEN span_dialect = 'semconv' AND contains(content_attributes::VARCHAR, '"gen_ai.completion.')
             THEN content_attributes END AS legacy_completion,
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
             WHEN span_dialect IN ('logfire', 'ai_sdk', 'haystack') THEN 'chat'
             ELSE coalesce(a."gen_ai.operation.name", a."llm.request.type") END AS operation,
        coalesce(a."gen_ai.provider.name", a."gen_ai.system", a."llm.system", a."llm.provider") AS provider,
        -- OpenInference's opt-in gen_ai.request.model holds the response model: read the request's model
        -- first: its invocation parameters (a small document), else the request body.
        CASE WHEN span_dialect = 'openinference'
             THEN coalesce(oi_params ->> 'model', oi_request.model, a."gen_ai.request.model")
             ELSE coalesce(a."gen_ai.request.model", a."ai.model.id", a."model") END AS request_model,
        -- As sent: Traceloop strips the "org/" prefix ("Qwen3-0.6B"), the others keep it.
        coalesce(a."gen_ai.response.model", oi_response.model, a."llm.model_name",
                 haystack_output[1].meta.model) AS response_model,

        CASE dialect
            WHEN 'openinference' THEN
                -- a request body in OpenAI's shape (a framework's input.value is its own: LangChain's
                -- "messages" are lists of serialized objects, without roles)
                CASE WHEN oi_request.messages[1].role IS NOT NULL
                     THEN [openai_message(m, NULL) FOR m IN oi_request.messages]
                     WHEN oi_input_list[1].role IS NOT NULL
                     THEN [openai_message(m, NULL) FOR m IN oi_input_list]
                     -- [] when none: the final SELECT makes it NULL (a nullif here would plan it twice)
                     ELSE oi_call_messages(content_attributes, 'llm.input_messages.') END
            WHEN 'legacy_events' THEN legacy_input
            WHEN 'span_events' THEN span_event_input_messages(span_events)
            WHEN 'logfire' THEN [openai_message(m, NULL) FOR m IN logfire_input]
            WHEN 'ai_sdk' THEN ai_sdk_input_messages(TRY_CAST(attributes ->> 'ai.prompt.messages' AS JSON))
            WHEN 'haystack' THEN [haystack_message(m) FOR m IN haystack_input]
            -- system instructions sent apart come first, unless the input messages hold them too (the
            -- contrib openai-agents-v2 writes both)
            ELSE genai_input_messages(
                TRY_CAST(content."gen_ai.input.messages" AS JSON),
                CASE WHEN content."gen_ai.system_instructions" IS NOT NULL
                          AND NOT regexp_matches(content."gen_ai.input.messages", '"role"\s*:\s*"system"')
                     THEN TRY_CAST(content."gen_ai.system_instructions" AS JSON) END)
        END AS input_messages_list,
        CASE dialect
            WHEN 'openinference' THEN
                CASE WHEN oi_response.choices IS NOT NULL
                     THEN [openai_output_message(c) FOR c IN oi_response.choices]
                     -- llm.finish_reason is the first choice's only; [] when none, as above
                     ELSE list_transform(CASE WHEN oi_output_list[1].role IS NOT NULL
                                              THEN [openai_message(m, 'assistant') FOR m IN oi_output_list]
                                              ELSE oi_call_messages(content_attributes,
                                                                    'llm.output_messages.')
                                         END,
                                         lambda m, i: with_finish_reason(
                                             m, CASE WHEN i = 1 THEN a."llm.finish_reason" END)) END
            WHEN 'legacy_events' THEN legacy_output
            WHEN 'span_events' THEN span_event_output_messages(span_events)
            -- Logfire records no finish reason
            WHEN 'logfire'
            THEN [with_finish_reason(m, NULL) FOR m IN responses_output_messages(logfire_output)]
            WHEN 'ai_sdk'
            THEN [ai_sdk_output_message(attributes ->> 'ai.response.text',
                                        TRY_CAST(attributes ->> 'ai.response.toolCalls' AS JSON),
                                        a."ai.response.finishReason")]
            WHEN 'haystack'
            THEN [with_finish_reason(haystack_message(m), m.meta.finish_reason) FOR m IN haystack_output]
            ELSE genai_output_messages(TRY_CAST(content."gen_ai.output.messages" AS JSON), legacy_completion)
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
            WHEN dialect = 'span_events'
            THEN [m.finish_reason FOR m IN span_event_output_messages(span_events)]
            WHEN dialect = 'ai_sdk' THEN [finish_reason(a."ai.response.finishReason")]
            WHEN dialect = 'haystack' THEN [finish_reason(m.meta.finish_reason) FOR m IN haystack_output]
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
        coalesce(a."gen_ai.usage.input_tokens", a."gen_ai.usage.prompt_tokens", a."llm.token_count.prompt",
                 haystack_output[1].meta.usage.prompt_tokens) AS input_tokens,
        coalesce(a."gen_ai.usage.output_tokens", a."gen_ai.usage.completion_tokens",
                 a."llm.token_count.completion", haystack_output[1].meta.usage.completion_tokens)
            AS output_tokens,
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

        -- Token data: the gateway's packed arrays, or the raw vLLM response that OpenInference keeps; only
        -- from a sender the server vouches for (a harness's token ids are claims: retokenized, never exact).
        CASE WHEN span_dialect = 'gateway' THEN gw_prompt_token_ids
             WHEN vouched(sender) THEN oi_response.prompt_token_ids END AS prompt_token_ids,
        CASE WHEN span_dialect = 'gateway' THEN gw_choice_token_ids
             WHEN vouched(sender) THEN [c.token_ids FOR c IN oi_response.choices] END
            AS completion_token_ids_raw,
        CASE WHEN span_dialect = 'gateway' THEN gw_choice_logprobs
             WHEN vouched(sender) THEN [[t.logprob FOR t IN c.logprobs.content] FOR c IN oi_response.choices]
        END AS completion_logprobs_raw,

        policy_version,
        CASE span_dialect
            WHEN 'gateway' THEN try(json(a."otel_rl.sampling.params"))
            WHEN 'openinference' THEN oi_params
        END AS sampling_params,
        -- the gateway's: whether vLLM sampled from a constrained distribution, and what the recorded logprobs
        -- are (sampling | rescored | constrained: otel_rl/gateway/rescoring.py, docs/gateway.md)
        CASE WHEN span_dialect = 'gateway' THEN a."otel_rl.decoding.constrained" END AS decoding_constrained,
        CASE WHEN span_dialect = 'gateway' THEN a."otel_rl.logprobs.source" END AS recorded_logprobs_source,
        coalesce(a."otel_rl.server.url", a."gen_ai.openai.api_base",
                 a."server.address" || coalesce(':' || a."server.port", '')) AS server_url,
        resource_attributes ->> 'service.name' AS service_name,
        scope_name,
        sender,
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
    -- vLLM's logprobs as it sampled, unless the gateway says otherwise (spans recorded before it did say)
    CASE WHEN list_bool_or([l IS NOT NULL FOR l IN c.completion_logprobs_raw])
         THEN coalesce(c.recorded_logprobs_source, 'sampling') END AS logprobs_source,
    c.decoding_constrained,
    c.policy_version,
    c.sampling_params,
    c.server_url,
    c.service_name,
    c.scope_name,
    c.sender,
    c.gateway_call.trace_id AS superseded_by_trace_id,
    c.gateway_call.span_id AS superseded_by_span_id
FROM normalized c;

-- One row per model call (PLAN.md contract): client rows superseded by a gateway row are left out.
CREATE OR REPLACE VIEW llm_calls AS
SELECT * EXCLUDE (superseded_by_trace_id, superseded_by_span_id)
FROM llm_call_rows
WHERE superseded_by_span_id IS NULL;

-- Each call span that is not a row of llm_calls, and the row that counts it (its gateway call or duplicate).
CREATE OR REPLACE VIEW llm_call_superseded AS
SELECT trace_id, span_id, {'trace_id': superseded_by_trace_id, 'span_id': superseded_by_span_id} AS gateway_call
FROM llm_call_rows
WHERE superseded_by_span_id IS NOT NULL;

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
-- llm_call_rows has every call span (those another row counts too), read from its columns
ANTI JOIN llm_call_rows s ON s.trace_id = e.trace_id AND s.span_id = e.span_id;
