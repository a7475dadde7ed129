-- Model calls recognized by what they are: the spans that are model calls under any live convention,
-- whatever their instrumentation scope, and the log records carrying their content (docs/views.md "Which
-- spans are calls").

-- Every attribute a call's columns come from but its content, parsed once per span into a typed struct (each
-- `->>` would parse the whole document again). Typed reads are lenient: a value of another type reads as
-- NULL. Content attributes are in spans.content_attributes (schema.sql), parsed only for the columns that
-- need them (messages, tool definitions, OpenInference's request and response bodies).
CREATE OR REPLACE MACRO call_attributes_of(attributes) AS from_json(attributes, '{
    "gen_ai.operation.name": "VARCHAR", "openinference.span.kind": "VARCHAR",
    "gen_ai.provider.name": "VARCHAR", "gen_ai.system": "VARCHAR",
    "llm.system": "VARCHAR", "llm.provider": "VARCHAR",
    "gen_ai.request.model": "VARCHAR", "gen_ai.response.model": "VARCHAR", "llm.model_name": "VARCHAR",
    "gen_ai.response.id": "VARCHAR",
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
    "llm.invocation_parameters": "VARCHAR", "llm.request.type": "VARCHAR", "logfire.tags": "VARCHAR[]",
    "model": "VARCHAR", "ai.operationId": "VARCHAR", "ai.model.id": "VARCHAR",
    "ai.response.finishReason": "VARCHAR",
    "error.type": "VARCHAR", "gen_ai.openai.api_base": "VARCHAR",
    "server.address": "VARCHAR", "server.port": "INTEGER",
    "otel_rl.policy.version": "INTEGER", "otel_rl.sampling.params": "VARCHAR",
    "otel_rl.server.url": "VARCHAR",
    "otel_rl.decoding.constrained": "BOOLEAN", "otel_rl.logprobs.source": "VARCHAR"}');

-- The latest semconv content of a call: a span's content_attributes, or an operation-details log record's
-- attributes. Read as text, whether sent as a JSON string (spans) or structured (log records), then read
-- with TRY_CAST(... AS JSON): one parse, and invalid JSON gives NULL rather than breaking every query.
CREATE OR REPLACE MACRO semconv_content_of(attributes) AS from_json(attributes, '{
    "gen_ai.input.messages": "VARCHAR", "gen_ai.output.messages": "VARCHAR",
    "gen_ai.system_instructions": "VARCHAR", "gen_ai.tool.definitions": "VARCHAR"}');

-- The operations that are model calls, under each convention's key: GenAI `gen_ai.operation.name` (every
-- semconv library, Logfire, Pydantic AI, Strands, the contrib openai-agents-v2, the gateway), OpenInference
-- `openinference.span.kind`, Traceloop's older `llm.request.type`. Agent, tool and embedding operations
-- (invoke_agent, create_agent, execute_tool, embeddings, AGENT, TOOL, CHAIN, EMBEDDING...) are not calls.
CREATE OR REPLACE MACRO is_call_operation(operations) AS
    list_has_any(operations, ['chat', 'text_completion', 'generate_content', 'completion', 'LLM']);

-- Spans that are model calls, whatever their instrumentation scope: by their attributes (above, and Logfire's
-- LLM tag, the Vercel AI SDK's operation ids), or by their name where a harness's convention names the call
-- span (Claude Code's `claude_code.llm_request`, Google ADK's `call_llm`, Codex's
-- `model_client.stream_responses_api`), or by their component where a framework's tracer says nothing else
-- (Haystack's `haystack.component.run` of a `*ChatGenerator`).
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
    sender,
    a,
    CASE
        -- the gateway's own record only: the same scope from another sender is that sender's claim (semconv)
        WHEN scope_name = 'otel_rl.gateway' AND vouched(sender) THEN 'gateway'
        WHEN a."openinference.span.kind" = 'LLM' THEN 'openinference'
        WHEN a."gen_ai.operation.name" IS NULL AND list_contains(a."logfire.tags", 'LLM') THEN 'logfire'
        WHEN a."ai.operationId" IS NOT NULL THEN 'ai_sdk'
        WHEN name = 'haystack.component.run' THEN 'haystack'
        ELSE 'semconv'  -- refined in llm_call_rows with the content that arrived
    END AS span_dialect
FROM (
    SELECT *, call_attributes_of(attributes) AS a
    FROM spans
    -- a text test first, then one parse of the keys: only call spans have their attributes parsed whole
    WHERE ((contains(attributes::VARCHAR, 'gen_ai.operation.name')
            OR contains(attributes::VARCHAR, 'openinference.span.kind')
            OR contains(attributes::VARCHAR, 'llm.request.type'))
           AND is_call_operation(json_extract_string(attributes, [
               '$."gen_ai.operation.name"', '$."openinference.span.kind"', '$."llm.request.type"'])))
       -- Logfire's integrations tag their model call spans LLM (its OpenAI Agents spans have no operation)
       OR (contains(attributes::VARCHAR, '"logfire.tags"')
           AND list_contains(json_extract_string(attributes, '$."logfire.tags"[*]'), 'LLM'))
       -- the Vercel AI SDK's provider calls (opencode); its ai.streamText / ai.generateText wrap them
       OR (contains(attributes::VARCHAR, '"ai.operationId"')
           AND json_extract_string(attributes, '$."ai.operationId"') IN (
               'ai.streamText.doStream', 'ai.generateText.doGenerate', 'ai.streamObject.doStream',
               'ai.generateObject.doGenerate'))
       OR name IN ('claude_code.llm_request', 'call_llm', 'model_client.stream_responses_api')
       -- Haystack's own tracer, which writes only haystack.* attributes: a chat generator's component run
       OR (name = 'haystack.component.run'
           AND ends_with(json_extract_string(attributes, '$."haystack.component.type"'), 'ChatGenerator'))
)
-- OpenInference marks every request of the openai client LLM, `client.models.list()` too: those name no
-- model, and are not calls. LlamaIndex marks an LLM's helper methods LLM too: `_prepare_chat_with_tools` is
-- no call (and the wrapper around a streamed call is its duplicate: llm_call_index). Tested by name, not by
-- the span's content: reading content_attributes here would cost every read of the call index.
WHERE a."openinference.span.kind" IS DISTINCT FROM 'LLM'
   OR ((a."llm.model_name" IS NOT NULL
        OR json_extract_string(a."llm.invocation_parameters", '$.model') IS NOT NULL)
       AND NOT ends_with(name, '._prepare_chat_with_tools'));

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

