-- Message builders for the dialects of agent frameworks, beside those of 10_macros.sql (docs/views.md
-- "Dialects"): OpenInference spans of frameworks, whose input.value / output.value are message lists rather
-- than OpenAI request and response bodies, and whose flattened tool calls may skip indices.

-- OpenInference's flattened message, without the empty tool calls of skipped indices (the Agents SDK's
-- instrumentation numbers a message's tool calls by their place in the run: `tool_calls.1.` alone).
CREATE OR REPLACE MACRO oi_call_message(attrs, p) AS chat_message(
    attrs ->> (p || 'role'),
    attrs ->> (p || 'content'),
    [c FOR c IN [{'id': attrs ->> (p || 'tool_calls.' || j || '.tool_call.id'),
                  'name': attrs ->> (p || 'tool_calls.' || j || '.tool_call.function.name'),
                  'arguments': attrs ->> (p || 'tool_calls.' || j || '.tool_call.function.arguments')}
                 FOR j IN range(oi_count(attrs, p || 'tool_calls.'))]
        IF c.id IS NOT NULL OR c.name IS NOT NULL],
    attrs ->> (p || 'tool_call_id'),
    NULL
);

CREATE OR REPLACE MACRO oi_call_messages(attrs, prefix) AS
    [oi_call_message(attrs, prefix || i || '.message.') FOR i IN range(oi_count(attrs, prefix))];

-- input.value / output.value holding a list of OpenAI chat messages (the Agents SDK's generation spans).
CREATE OR REPLACE MACRO oi_message_list_of(j) AS from_json(j, '[{
    "role": "VARCHAR", "content": "JSON", "tool_call_id": "VARCHAR", "id": "VARCHAR",
    "reasoning_content": "VARCHAR", "reasoning": "VARCHAR",
    "tool_calls": [{"id": "VARCHAR", "function": {"name": "VARCHAR", "arguments": "JSON"}}]}]');

-- ---------------------------------------------------------------- GenAI content as span events
-- Strands Agents records a call's messages as span events (gen_ai.{system,user,assistant,tool}.message with
-- a `content` attribute, gen_ai.choice with `message` and `finish_reason`) whose text is a JSON list of
-- Bedrock-style content blocks: {"text"}, {"toolUse": {toolUseId, name, input}}, {"toolResult": {toolUseId,
-- content: [{"text"}]}}. Text that is not such a list is the message's text.
CREATE OR REPLACE MACRO content_blocks_of(j) AS from_json(j, '[{
    "text": "VARCHAR", "toolUse": {"toolUseId": "VARCHAR", "name": "VARCHAR", "input": "JSON"},
    "toolResult": {"toolUseId": "VARCHAR", "content": [{"text": "VARCHAR"}]}}]');

-- The content events of a span, each parsed once: name, text, blocks (NULL when the text is not blocks).
CREATE OR REPLACE MACRO span_content_events_of(events) AS [
    {'name': e.name, 'text': e.text, 'finish_reason': e.finish_reason,
     'blocks': CASE WHEN starts_with(e.text, '[') THEN try(content_blocks_of(e.text)) END}
    FOR e IN [{'name': ev ->> 'name',
               'text': coalesce(ev -> 'attributes' ->> 'content', ev -> 'attributes' ->> 'message'),
               'finish_reason': ev -> 'attributes' ->> 'finish_reason'}
              FOR ev IN json_extract(events, '$[*]')]
    IF e.name IN ('gen_ai.system.message', 'gen_ai.user.message', 'gen_ai.assistant.message',
                  'gen_ai.tool.message', 'gen_ai.choice')];

CREATE OR REPLACE MACRO block_message(role, e) AS chat_message(
    role,
    CASE WHEN e.blocks IS NULL THEN e.text
         ELSE list_aggr([b.text FOR b IN e.blocks IF b.text <> ''], 'string_agg', '') END,
    [{'id': b.toolUse.toolUseId, 'name': b.toolUse.name, 'arguments': json_text(b.toolUse.input)}
        FOR b IN coalesce(e.blocks, []) IF b.toolUse IS NOT NULL],
    NULL,
    NULL
);

-- Input messages: a tool message holding several results becomes one tool message per result.
CREATE OR REPLACE MACRO span_event_input_messages(parsed) AS flatten([
    CASE WHEN e.name = 'gen_ai.tool.message'
              AND len([b FOR b IN coalesce(e.blocks, []) IF b.toolResult IS NOT NULL]) > 0
         THEN [chat_message('tool', list_aggr([c.text FOR c IN b.toolResult.content], 'string_agg', ''),
                            NULL, b.toolResult.toolUseId, NULL)
               FOR b IN e.blocks IF b.toolResult IS NOT NULL]
         ELSE [block_message(regexp_extract(e.name, '^gen_ai\.(\w+)\.message$', 1), e)] END
    FOR e IN parsed IF e.name <> 'gen_ai.choice']);

CREATE OR REPLACE MACRO span_event_output_messages(parsed) AS [
    with_finish_reason(block_message('assistant', e), e.finish_reason)
    FOR e IN parsed IF e.name = 'gen_ai.choice'];

-- ---------------------------------------------------------------- latest semconv, as frameworks write it
-- The parts format of 10_macros.sql as frameworks write it too: Pydantic AI puts a tool result's value under
-- "result" (the convention says "response") and sends tool results in a "user" message; LiteLLM keeps
-- OpenAI's "tool_calls" / "tool_call_id" beside the parts, and its answer's tool calls only in the legacy
-- flattened attributes gen_ai.completion.{i}.function_call.{name,arguments}. A message holding only tool
-- results is a tool message (one per result), whatever its role.
CREATE OR REPLACE MACRO genai_messages_of(doc) AS from_json(doc, '[{
    "role": "VARCHAR", "finish_reason": "VARCHAR", "tool_call_id": "VARCHAR",
    "tool_calls": [{"id": "VARCHAR", "function": {"name": "VARCHAR", "arguments": "JSON"}}],
    "parts": [{"type": "VARCHAR", "content": "VARCHAR", "id": "VARCHAR", "name": "VARCHAR",
               "arguments": "VARCHAR", "response": "VARCHAR", "result": "VARCHAR"}]}]');

-- A tool result's text; Strands sends it as content blocks [{"text": ...}].
CREATE OR REPLACE MACRO tool_result_text(r) AS
    CASE WHEN starts_with(r, '[{') AND json_valid(r)
         THEN coalesce(list_aggr(json_extract_string(r, '$[*].text'), 'string_agg', ''), r)
         ELSE r END;

CREATE OR REPLACE MACRO genai_message(m, more_tool_calls) AS chat_message(
    m.role,
    coalesce(parts_text(m.parts, 'text'),
             list_aggr([coalesce(p.response, p.result) FOR p IN m.parts
                        IF p.type = 'tool_call_response' AND coalesce(p.response, p.result) <> ''],
                       'string_agg', '')),
    [{'id': p.id, 'name': p.name, 'arguments': p.arguments} FOR p IN m.parts IF p.type = 'tool_call']
        || openai_tool_calls(coalesce(m.tool_calls, [])) || more_tool_calls,
    coalesce([p.id FOR p IN m.parts IF p.type = 'tool_call_response'][1], m.tool_call_id),
    parts_text(m.parts, 'reasoning')
);

CREATE OR REPLACE MACRO genai_input_messages(doc, system_instructions) AS
    CASE WHEN system_instructions IS NOT NULL THEN
        [chat_message('system',
                      parts_text(from_json(system_instructions,
                                           '[{"type": "VARCHAR", "content": "VARCHAR"}]'), 'text'),
                      NULL, NULL, NULL)]
    ELSE [] END
    || flatten([
        CASE WHEN len([p FOR p IN m.parts IF p.type = 'tool_call_response']) > 0
                  AND len([p FOR p IN m.parts IF p.type NOT IN ('tool_call_response', 'text')]) = 0
             THEN [chat_message('tool', tool_result_text(coalesce(p.response, p.result)), NULL, p.id, NULL)
                   FOR p IN m.parts IF p.type = 'tool_call_response']
             ELSE [genai_message(m, [])] END
        FOR m IN genai_messages_of(doc)]);

-- `attrs`: the span's content attributes, for LiteLLM's flattened tool calls of choice i.
CREATE OR REPLACE MACRO genai_output_messages(doc, attrs) AS list_transform(
    genai_messages_of(doc),
    lambda m, i: with_finish_reason(
        genai_message(m, CASE WHEN attrs ->> ('gen_ai.completion.' || (i - 1) || '.function_call.name')
                                   IS NOT NULL
                              THEN [{'id': NULL::VARCHAR,
                                     'name': attrs ->> ('gen_ai.completion.' || (i - 1)
                                                        || '.function_call.name'),
                                     'arguments': attrs ->> ('gen_ai.completion.' || (i - 1)
                                                             || '.function_call.arguments')}]
                              ELSE [] END),
        m.finish_reason));

-- ---------------------------------------------------------------- Logfire's OpenAI Agents spans
-- "Chat completion with ..." / "Responses API with ..." spans (tag LLM): `input` holds the chat messages
-- sent, `output` the Agents SDK's response objects, whose `output` items are Responses API items: "message"
-- (content parts "output_text"), "function_call" (call_id, name, arguments), "reasoning".
CREATE OR REPLACE MACRO responses_of(j) AS from_json(j, '[{"output": [{
    "type": "VARCHAR", "call_id": "VARCHAR", "name": "VARCHAR", "arguments": "VARCHAR",
    "content": [{"type": "VARCHAR", "text": "VARCHAR"}], "summary": [{"text": "VARCHAR"}]}]}]');

CREATE OR REPLACE MACRO responses_output_messages(responses) AS [
    chat_message(
        'assistant',
        list_aggr(flatten([[c.text FOR c IN coalesce(i.content, [])
                            IF c.type = 'output_text' AND c.text <> '']
                           FOR i IN r.output IF i.type = 'message']), 'string_agg', ''),
        [{'id': i.call_id, 'name': i.name, 'arguments': i.arguments}
            FOR i IN r.output IF i.type = 'function_call'],
        NULL,
        list_aggr(flatten([[s.text FOR s IN coalesce(i.summary, [])]
                           FOR i IN r.output IF i.type = 'reasoning']), 'string_agg', ''))
    FOR r IN responses];

-- ---------------------------------------------------------------- Vercel AI SDK (opencode)
-- ai.*.doStream / ai.*.doGenerate spans: `ai.prompt.messages` (content a string or parts: text, tool-call
-- {toolCallId, toolName, input}, tool-result {toolCallId, output}), `ai.response.text`,
-- `ai.response.toolCalls` ([{toolCallId, toolName, input}]), `ai.response.finishReason`.
CREATE OR REPLACE MACRO ai_sdk_messages_of(j) AS from_json(j, '[{"role": "VARCHAR", "content": "JSON"}]');

CREATE OR REPLACE MACRO ai_sdk_parts_of(c) AS from_json(c, '[{
    "type": "VARCHAR", "text": "VARCHAR", "toolCallId": "VARCHAR", "toolName": "VARCHAR", "input": "JSON",
    "output": "JSON"}]');

CREATE OR REPLACE MACRO ai_sdk_message(role, parts, text) AS chat_message(
    role,
    coalesce(text, list_aggr([p.text FOR p IN parts IF p.type = 'text' AND p.text <> ''], 'string_agg', '')),
    [{'id': p.toolCallId, 'name': p.toolName, 'arguments': json_text(p.input)}
        FOR p IN coalesce(parts, []) IF p.type = 'tool-call'],
    NULL,
    list_aggr([p.text FOR p IN coalesce(parts, []) IF p.type = 'reasoning'], 'string_agg', ''));

-- A tool message holds one result per part: one normalized tool message each.
CREATE OR REPLACE MACRO ai_sdk_input_messages(doc) AS flatten([
    CASE WHEN m.role = 'tool'
         THEN [chat_message('tool', json_text(coalesce(p.output -> 'value', p.output)), NULL, p.toolCallId,
                            NULL)
               FOR p IN ai_sdk_parts_of(m.content) IF p.type = 'tool-result']
         WHEN json_type(m.content) = 'VARCHAR'
         THEN [chat_message(m.role, m.content ->> '$', NULL, NULL, NULL)]
         ELSE [ai_sdk_message(m.role, ai_sdk_parts_of(m.content), NULL)] END
    FOR m IN ai_sdk_messages_of(doc)]);

CREATE OR REPLACE MACRO ai_sdk_output_message(text, tool_calls, reason) AS with_finish_reason(
    chat_message('assistant', text,
                 [{'id': c.toolCallId, 'name': c.toolName, 'arguments': json_text(c.input)}
                     FOR c IN coalesce(from_json(tool_calls, '[{
                         "toolCallId": "VARCHAR", "toolName": "VARCHAR", "input": "JSON"}]'), [])],
                 NULL, NULL),
    finish_reason(reason));

-- ---------------------------------------------------------------- Haystack's own tracer
-- Haystack traces each component run as a `haystack.component.run` span with only `haystack.*` attributes; a
-- chat generator's run is a model call. Its content tags hold Haystack's serialized ChatMessages:
-- `haystack.component.input` {"messages": [...]}, `haystack.component.output` {"replies": [...]}, each
-- {"role", "meta": {"model", "finish_reason", "usage"}, "content": [{"text"} | {"tool_call": {"tool_name",
-- "arguments", "id"}} | {"tool_call_result": {"result", "origin": {"id"}}} |
-- {"reasoning": {"reasoning_text"}}]}.
CREATE OR REPLACE MACRO haystack_messages_of(j) AS from_json(j, '[{"role": "VARCHAR",
    "meta": {"model": "VARCHAR", "finish_reason": "VARCHAR",
             "usage": {"prompt_tokens": "INTEGER", "completion_tokens": "INTEGER"}},
    "content": [{"text": "VARCHAR",
                 "tool_call": {"tool_name": "VARCHAR", "arguments": "JSON", "id": "VARCHAR"},
                 "tool_call_result": {"result": "VARCHAR", "origin": {"id": "VARCHAR"}},
                 "reasoning": {"reasoning_text": "VARCHAR"}}]}]');

-- A tool message's content is its result.
CREATE OR REPLACE MACRO haystack_message(m) AS chat_message(
    m.role,
    coalesce(list_aggr([p.text FOR p IN m.content IF p.text <> ''], 'string_agg', ''),
             list_aggr([p.tool_call_result.result FOR p IN m.content IF p.tool_call_result IS NOT NULL],
                       'string_agg', '')),
    [{'id': p.tool_call.id, 'name': p.tool_call.tool_name, 'arguments': json_text(p.tool_call.arguments)}
        FOR p IN m.content IF p.tool_call IS NOT NULL],
    [p.tool_call_result.origin.id FOR p IN m.content IF p.tool_call_result IS NOT NULL][1],
    list_aggr([p.reasoning.reasoning_text FOR p IN m.content IF p.reasoning IS NOT NULL],
              'string_agg', '')
);
