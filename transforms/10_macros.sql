-- Scalar macros shared by the normalized views: JSON helpers, value normalization, and one builder per
-- message dialect, all producing the one normalized message struct (docs/views.md "Messages").

-- Span attributes carry JSON documents as strings ("[{\"role\": ...}]"); log attributes carry the same
-- documents structured. Either way: the structured value. Invalid JSON text gives NULL, so that one bad
-- attribute cannot break every query over the view.
CREATE OR REPLACE MACRO json_doc(j) AS
    CASE WHEN json_type(j) = 'VARCHAR'
         THEN CASE WHEN json_valid(j ->> '$') THEN json(j ->> '$') END
         ELSE j END;

-- A JSON value as text: strings unquoted, JSON null as NULL, anything else as its JSON text
-- (tool-call arguments arrive as a JSON string from OpenAI and as an object from the semconv libraries).
CREATE OR REPLACE MACRO json_text(j) AS
    CASE json_type(j) WHEN 'VARCHAR' THEN j ->> '$' WHEN 'NULL' THEN NULL ELSE j::VARCHAR END;

-- Finish reasons as OpenAI spells them; the semconv libraries write 'tool_call' for OpenAI's 'tool_calls'.
-- An empty reason (the gateway writes "" for a choice that has none) is NULL.
CREATE OR REPLACE MACRO finish_reason(r) AS
    CASE nullif(lower(r), '')
        WHEN 'tool_call' THEN 'tool_calls'
        WHEN 'function_call' THEN 'tool_calls'
        WHEN 'max_tokens' THEN 'length'
        WHEN 'end_turn' THEN 'stop'
        WHEN 'stop_sequence' THEN 'stop'
        ELSE nullif(lower(r), '') END;

-- Exception class names without module or repr noise: util-genai 1.1b0 writes "<class 'openai.NotFoundError'>",
-- exception events "openai.NotFoundError"; both become "NotFoundError".
CREATE OR REPLACE MACRO error_type_name(e) AS
    coalesce(nullif(regexp_extract(e, '(\w+)''?>?\s*$', 1), ''), nullif(e, ''));

-- The normalized message (PLAN.md "Normalized message JSON"); empty strings and lists become NULL so that
-- dialects which write "" or [] for "nothing" agree with those that omit the field.
CREATE OR REPLACE MACRO chat_message(role, content, tool_calls, tool_call_id, reasoning) AS {
    'role': role::VARCHAR,
    'content': nullif(content::VARCHAR, ''),
    'tool_calls': nullif(tool_calls::STRUCT(id VARCHAR, name VARCHAR, arguments VARCHAR)[], []),
    'tool_call_id': tool_call_id::VARCHAR,
    'reasoning': nullif(reasoning::VARCHAR, '')
};

CREATE OR REPLACE MACRO with_finish_reason(message, reason) AS
    struct_insert(message, finish_reason := finish_reason(reason));

-- ---------------------------------------------------------------- latest semconv ("parts" format)
-- {"role", "parts": [{"type": "text"|"reasoning"|"tool_call"|"tool_call_response", ...}], "finish_reason"}

CREATE OR REPLACE MACRO semconv_parts_text(parts, part_type, field) AS
    array_to_string([json_text(json_extract(p, field)) FOR p IN parts IF p ->> 'type' = part_type], '');

CREATE OR REPLACE MACRO semconv_message(m) AS chat_message(
    m ->> 'role',
    coalesce(nullif(semconv_parts_text(json_extract(m, '$.parts[*]'), 'text', 'content'), ''),
             semconv_parts_text(json_extract(m, '$.parts[*]'), 'tool_call_response', 'response')),
    [{'id': p ->> 'id', 'name': p ->> 'name', 'arguments': json_text(json_extract(p, 'arguments'))}
        FOR p IN json_extract(m, '$.parts[*]') IF p ->> 'type' = 'tool_call'],
    [p ->> 'id' FOR p IN json_extract(m, '$.parts[*]') IF p ->> 'type' = 'tool_call_response'][1],
    semconv_parts_text(json_extract(m, '$.parts[*]'), 'reasoning', 'content')
);

-- Input messages: a message holding several tool results becomes one tool message per result, since
-- the normalized message has one tool_call_id. System instructions (a separate attribute) come first.
CREATE OR REPLACE MACRO semconv_input_messages(doc, system_instructions) AS
    CASE WHEN system_instructions IS NOT NULL THEN
        [chat_message('system', semconv_parts_text(json_extract(system_instructions, '$[*]'), 'text', 'content'),
                      NULL, NULL, NULL)]
    ELSE [] END
    || flatten([
        CASE WHEN len([p FOR p IN json_extract(m, '$.parts[*]') IF p ->> 'type' = 'tool_call_response']) > 1
             THEN [chat_message('tool', json_text(json_extract(p, 'response')), NULL, p ->> 'id', NULL)
                   FOR p IN json_extract(m, '$.parts[*]') IF p ->> 'type' = 'tool_call_response']
             ELSE [semconv_message(m)] END
        FOR m IN json_extract(doc, '$[*]')]);

CREATE OR REPLACE MACRO semconv_output_messages(doc) AS
    [with_finish_reason(semconv_message(m), m ->> 'finish_reason') FOR m IN json_extract(doc, '$[*]')];

-- Tool definitions in OpenAI shape; Traceloop writes them flattened ({"type", "name", "parameters"}).
CREATE OR REPLACE MACRO openai_tool_definitions(doc) AS
    to_json([
        CASE WHEN json_extract(t, 'function') IS NOT NULL THEN t
             ELSE json_object('type', coalesce(t ->> 'type', 'function'),
                              'function', json_object('name', t ->> 'name',
                                                      'description', t ->> 'description',
                                                      'parameters', json_extract(t, 'parameters'))) END
        FOR t IN json_extract(doc, '$[*]')]);

-- ---------------------------------------------------------------- OpenAI chat format
-- Request messages and response choices (OpenInference input.value / output.value) and the bodies of the
-- legacy gen_ai.*.message / gen_ai.choice log events.

-- Content is a string, null, or a list of parts [{"type": "text", "text": ...}].
CREATE OR REPLACE MACRO openai_content(c) AS
    CASE json_type(c)
        WHEN 'ARRAY' THEN array_to_string([p ->> 'text' FOR p IN json_extract(c, '$[*]') IF p ->> 'type' = 'text'], '')
        ELSE json_text(c) END;

CREATE OR REPLACE MACRO openai_tool_calls(calls) AS
    [{'id': c ->> 'id', 'name': c ->> '$.function.name', 'arguments': json_text(json_extract(c, '$.function.arguments'))}
        FOR c IN calls];

-- The legacy gen_ai.tool.message event (official v2) names the call id "id" instead of "tool_call_id".
CREATE OR REPLACE MACRO openai_message(m, role) AS chat_message(
    coalesce(m ->> 'role', role),
    openai_content(json_extract(m, 'content')),
    openai_tool_calls(json_extract(m, '$.tool_calls[*]')),
    coalesce(m ->> 'tool_call_id', CASE WHEN coalesce(m ->> 'role', role) = 'tool' THEN m ->> 'id' END),
    coalesce(m ->> 'reasoning_content', m ->> 'reasoning')
);

-- ---------------------------------------------------------------- OpenInference flattened attributes
-- llm.input_messages.{i}.message.{role,content,tool_call_id} and
-- llm.input_messages.{i}.message.tool_calls.{j}.tool_call.{id,function.name,function.arguments}
-- (same under llm.output_messages); the fallback when input.value / output.value is not JSON.

-- How many indexed entries start with `prefix` (e.g. 'llm.input_messages.'): the highest index + 1.
CREATE OR REPLACE MACRO oi_count(attrs, prefix) AS
    coalesce(list_max([regexp_extract(substr(k, length(prefix) + 1), '^(\d+)\.', 1)::INTEGER + 1
                       FOR k IN json_keys(attrs) IF starts_with(k, prefix)]), 0);

CREATE OR REPLACE MACRO oi_message(attrs, p) AS chat_message(
    attrs ->> (p || 'role'),
    attrs ->> (p || 'content'),
    [{'id': attrs ->> (p || 'tool_calls.' || j || '.tool_call.id'),
      'name': attrs ->> (p || 'tool_calls.' || j || '.tool_call.function.name'),
      'arguments': attrs ->> (p || 'tool_calls.' || j || '.tool_call.function.arguments')}
        FOR j IN range(oi_count(attrs, p || 'tool_calls.'))],
    attrs ->> (p || 'tool_call_id'),
    NULL
);

CREATE OR REPLACE MACRO oi_messages(attrs, prefix) AS
    [oi_message(attrs, prefix || i || '.message.') FOR i IN range(oi_count(attrs, prefix))];

-- ---------------------------------------------------------------- time

-- OTLP nanoseconds since the json_extract(epoch, TIMESTAMPTZ) (microseconds, exact, whatever the session time zone).
CREATE OR REPLACE MACRO ns_time(ns) AS
    CASE WHEN ns > 0 THEN TIMESTAMPTZ '1970-01-01 00:00:00+00' + to_microseconds((ns // 1000)::BIGINT) END;

-- ---------------------------------------------------------------- reading the views' JSON back

-- llm_calls.input_messages / output_messages (JSON) as a list of message structs, for SQL over messages.
CREATE OR REPLACE MACRO messages_of(j) AS from_json(j, '[{
    "role": "VARCHAR", "content": "VARCHAR",
    "tool_calls": [{"id": "VARCHAR", "name": "VARCHAR", "arguments": "VARCHAR"}],
    "tool_call_id": "VARCHAR", "reasoning": "VARCHAR", "finish_reason": "VARCHAR"}]');
