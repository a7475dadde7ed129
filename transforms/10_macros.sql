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

-- Finish reasons as OpenAI spells them; the semconv libraries write 'tool_call' for OpenAI's 'tool_calls',
-- Anthropic and Bedrock `tool_use` (Claude Code, Strands), the Vercel AI SDK `tool-calls` (opencode).
-- An empty reason (the gateway writes "" for a choice that has none) is NULL.
CREATE OR REPLACE MACRO finish_reason(r) AS
    CASE nullif(lower(r), '')
        WHEN 'tool_call' THEN 'tool_calls'
        WHEN 'tool_use' THEN 'tool_calls'
        WHEN 'tool-calls' THEN 'tool_calls'
        WHEN 'function_call' THEN 'tool_calls'
        WHEN 'max_tokens' THEN 'length'
        WHEN 'end_turn' THEN 'stop'
        WHEN 'stop_sequence' THEN 'stop'
        ELSE nullif(lower(r), '') END;

-- Exception class names without module or repr noise: util-genai 1.1b0 writes
-- "<class 'openai.NotFoundError'>", exception events "openai.NotFoundError"; both become "NotFoundError".
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
-- [{"role", "parts": [{"type": "text"|"reasoning"|"tool_call"|"tool_call_response", ...}], "finish_reason"}]
-- Documents are parsed once into typed structs (from_json): cheaper to plan and to run than many
-- JSON-path extractions of the same text. Part values read as VARCHAR are json_text's (a string unquoted,
-- anything else as its JSON text) without parsing them again.
-- A macro's argument is copied wherever the macro uses it, and so are the macros it calls (DuckDB's own
-- nullif and array_to_string are macros that use theirs twice): list comprehensions passed through them
-- are planned and run several times. Text is therefore joined with list_aggr(..., 'string_agg', ''),
-- which gives NULL rather than '' for nothing (chat_message makes '' NULL anyway).

-- The text of the parts of one type, joined; NULL when there is none.
CREATE OR REPLACE MACRO parts_text(parts, part_type) AS
    list_aggr([p.content FOR p IN parts IF p.type = part_type AND p.content <> ''], 'string_agg', '');

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
-- legacy gen_ai.*.message / gen_ai.choice log events. The legacy gen_ai.tool.message event (official v2)
-- names the call id "id"; Traceloop's gen_ai.choice puts tool_calls beside the message, not in it.

-- The JSON shapes read (DuckDB json_transform structures; absent keys are NULL).
CREATE OR REPLACE MACRO openai_message_of(j) AS from_json(j, '{
    "role": "VARCHAR", "content": "JSON", "tool_call_id": "VARCHAR", "id": "VARCHAR",
    "reasoning_content": "VARCHAR", "reasoning": "VARCHAR",
    "tool_calls": [{"id": "VARCHAR", "function": {"name": "VARCHAR", "arguments": "JSON"}}]}');

CREATE OR REPLACE MACRO openai_choice_of(j) AS from_json(j, '{
    "index": "INTEGER", "finish_reason": "VARCHAR", "token_ids": ["INTEGER"],
    "logprobs": {"content": [{"logprob": "FLOAT"}]},
    "tool_calls": [{"id": "VARCHAR", "function": {"name": "VARCHAR", "arguments": "JSON"}}],
    "message": {"role": "VARCHAR", "content": "JSON", "tool_call_id": "VARCHAR", "id": "VARCHAR",
        "reasoning_content": "VARCHAR", "reasoning": "VARCHAR",
        "tool_calls": [{"id": "VARCHAR", "function": {"name": "VARCHAR", "arguments": "JSON"}}]}}');

-- OpenInference input.value (the request body) and output.value (the raw response, vLLM extras included).
CREATE OR REPLACE MACRO oi_request_of(j) AS from_json(j, '{
    "model": "VARCHAR", "prompt": "JSON", "tools": "JSON",
    "messages": [{"role": "VARCHAR", "content": "JSON", "tool_call_id": "VARCHAR", "id": "VARCHAR",
         "reasoning_content": "VARCHAR", "reasoning": "VARCHAR",
         "tool_calls": [{"id": "VARCHAR", "function": {"name": "VARCHAR", "arguments": "JSON"}}]}]}');

CREATE OR REPLACE MACRO oi_response_of(j) AS from_json(j, '{
    "model": "VARCHAR", "prompt_token_ids": ["INTEGER"],
    "choices": [{"index": "INTEGER", "finish_reason": "VARCHAR", "token_ids": ["INTEGER"],
         "logprobs": {"content": [{"logprob": "FLOAT"}]},
         "tool_calls": [{"id": "VARCHAR", "function": {"name": "VARCHAR", "arguments": "JSON"}}],
         "message": {"role": "VARCHAR", "content": "JSON", "tool_call_id": "VARCHAR", "id": "VARCHAR",
             "reasoning_content": "VARCHAR", "reasoning": "VARCHAR",
             "tool_calls": [{"id": "VARCHAR", "function": {"name": "VARCHAR", "arguments": "JSON"}}]}}]}');

-- Content is a string, null, or a list of parts [{"type": "text", "text": ...}].
CREATE OR REPLACE MACRO openai_content(c) AS
    CASE json_type(c)
        WHEN 'ARRAY'
        -- NULL rather than '' when there is no text part: chat_message makes '' NULL anyway
        THEN list_aggr([p ->> 'text' FOR p IN json_extract(c, '$[*]') IF p ->> 'type' = 'text'],
                       'string_agg', '')
        ELSE json_text(c) END;

CREATE OR REPLACE MACRO openai_tool_calls(calls) AS
    [{'id': c.id, 'name': c.function.name, 'arguments': json_text(c.function.arguments)} FOR c IN calls];

CREATE OR REPLACE MACRO openai_message(m, role) AS chat_message(
    coalesce(m.role, role),
    openai_content(m.content),
    openai_tool_calls(m.tool_calls),
    coalesce(m.tool_call_id, CASE WHEN coalesce(m.role, role) = 'tool' THEN m.id END),
    coalesce(m.reasoning_content, m.reasoning)
);

-- A response choice (or a legacy gen_ai.choice event body) as an output message.
CREATE OR REPLACE MACRO openai_output_message(c) AS with_finish_reason(
    chat_message('assistant', openai_content(c.message.content),
                 openai_tool_calls(coalesce(c.message.tool_calls, []) || coalesce(c.tool_calls, [])),
                 NULL, coalesce(c.message.reasoning_content, c.message.reasoning)),
    c.finish_reason
);

-- ---------------------------------------------------------------- OpenInference flattened attributes
-- llm.input_messages.{i}.message.{role,content,tool_call_id} and
-- llm.input_messages.{i}.message.tool_calls.{j}.tool_call.{id,function.name,function.arguments}
-- (same under llm.output_messages); the fallback when input.value / output.value is not JSON.

-- How many indexed entries start with `prefix` (e.g. 'llm.input_messages.'): the highest index + 1.
-- Indices of up to four digits only: the collector refuses higher ones (4096 messages, 128 parts), and a
-- row stored before it did must not make every read build lists of millions of entries, or overflow.
CREATE OR REPLACE MACRO oi_count(attrs, prefix) AS
    coalesce(list_max([TRY_CAST(regexp_extract(substr(k, length(prefix) + 1), '^(\d{1,4})\.', 1) AS INTEGER)
                       + 1 FOR k IN json_keys(attrs) IF starts_with(k, prefix)]), 0);

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

-- llm.tools.{i}.tool.json_schema: each an OpenAI tool definition as a JSON string.
CREATE OR REPLACE MACRO oi_tool_definitions(attrs) AS
    nullif(to_json([json_doc(json_extract(attrs, 'llm.tools.' || i || '.tool.json_schema'))
                    FOR i IN range(oi_count(attrs, 'llm.tools.'))]), '[]'::JSON);

CREATE OR REPLACE MACRO oi_messages(attrs, prefix) AS
    [oi_message(attrs, prefix || i || '.message.') FOR i IN range(oi_count(attrs, prefix))];

-- ---------------------------------------------------------------- time

-- OTLP nanoseconds since the epoch as TIMESTAMPTZ (microseconds, exact, whatever the session time zone).
CREATE OR REPLACE MACRO ns_time(ns) AS
    CASE WHEN ns > 0 THEN TIMESTAMPTZ '1970-01-01 00:00:00+00' + to_microseconds((ns // 1000)::BIGINT) END;

-- ---------------------------------------------------------------- reading the views' JSON back

-- llm_calls.input_messages / output_messages (JSON) as a list of message structs, for SQL over messages.
CREATE OR REPLACE MACRO messages_of(j) AS from_json(j, '[{
    "role": "VARCHAR", "content": "VARCHAR",
    "tool_calls": [{"id": "VARCHAR", "name": "VARCHAR", "arguments": "VARCHAR"}],
    "tool_call_id": "VARCHAR", "reasoning": "VARCHAR", "finish_reason": "VARCHAR"}]');

-- Whether the server vouches for a raw row (its `sender`, set at ingest from the credential, docs/security.md
-- "What only the server vouches for"): its own components, or the admin token's holder (controller, trainer,
-- graders). A rollout key's rows are the harness's claims; rows stored before senders were recorded (NULL)
-- are no one's word either.
CREATE OR REPLACE MACRO vouched(sender) AS coalesce(sender IN ('server', 'admin'), false);

-- The reward training uses by default (otel_rl/transforms/rewards.py RewardSpec(), a training config without
-- a `reward` section): its name, rule and trusted sources. `rollouts.outcome_reward` follows it for a rollout
-- whose training run reported no reward of its own (reward_specs, 45_reward_specs.sql).
CREATE OR REPLACE MACRO outcome_reward_name() AS 'outcome';
CREATE OR REPLACE MACRO default_reward_spec() AS
    {'name': outcome_reward_name(), 'rule': 'last', 'trusted_sources': ['grader']};

-- Whether a reward spec's trusted sources trust `source`, as training's trusted() does
-- (otel_rl/transforms/rewards.py): `any` trusts every source, a reward sent without one too.
CREATE OR REPLACE MACRO reward_source_trusted(sources, source) AS
    list_contains(sources, 'any') OR coalesce(list_contains(sources, source), false);

-- Whether a source's figures (rollout_rows.outcome_reward_stats) count under a reward spec: a trusted source
-- with a numeric value ('(none)' is a record sent without a source).
CREATE OR REPLACE MACRO trusted_figures(s, spec) AS
    s.n > 0 AND reward_source_trusted(spec.trusted_sources, nullif(s.source, '(none)'));

-- The reward sources trusted by default (DEFAULT_TRUSTED_SOURCES).
CREATE OR REPLACE MACRO trusted_reward_source(source) AS
    reward_source_trusted(default_reward_spec().trusted_sources, source);

-- A name's trusted reward under a reward spec (rollouts.outcome_reward), from rollout_rows' per-source figures
-- of the name: the sources the spec trusts, combined by its rule as training combines their records
-- (otel_rl/transforms/rewards.py outcome_rewards(), tied to this by tests/test_rewards_by_name.py): `last`
-- the latest by the server's receive order, `mean`, `max`, `sum` over every value; NULL when none is trusted.
CREATE OR REPLACE MACRO trusted_reward(sources, spec) AS
    CASE spec.rule
        WHEN 'mean' THEN list_sum([s.total FOR s IN sources IF trusted_figures(s, spec)])
                         / list_sum([s.n FOR s IN sources IF trusted_figures(s, spec)])
        WHEN 'max' THEN list_max([s.top FOR s IN sources IF trusted_figures(s, spec)])
        WHEN 'sum' THEN list_sum([s.total FOR s IN sources IF trusted_figures(s, spec)])
        ELSE list_max([{'received': s.last_received, 'value': s.last}
                       FOR s IN sources IF trusted_figures(s, spec)]).value END;
