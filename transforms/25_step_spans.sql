-- Agent and tool spans recognized by what they are, under any live convention and whatever their scope:
-- the spans tool_calls (30) and agent_steps (35) read (docs/views.md "agent_steps").

-- The attributes a step's columns come from, parsed once per step span (see call_attributes_of).
CREATE OR REPLACE MACRO step_attributes_of(attributes) AS from_json(attributes, '{
    "gen_ai.operation.name": "VARCHAR", "openinference.span.kind": "VARCHAR",
    "traceloop.span.kind": "VARCHAR",
    "gen_ai.agent.name": "VARCHAR", "agent.name": "VARCHAR", "agent_name": "VARCHAR",
    "traceloop.entity.name": "VARCHAR", "gen_ai.handoff.to_agent": "VARCHAR",
    "gen_ai.tool.name": "VARCHAR", "tool.name": "VARCHAR", "tool_name": "VARCHAR",
    "gen_ai.tool.call.id": "VARCHAR", "tool_call.id": "VARCHAR", "tool.id": "VARCHAR",
    "tool_use_id": "VARCHAR",
    "gen_ai.tool.call.arguments": "JSON", "gen_ai.tool.call.result": "JSON",
    "tool_arguments": "JSON", "tool_response": "JSON", "tool_input": "JSON",
    "gcp.vertex.agent.tool_call_args": "JSON", "gcp.vertex.agent.tool_response": "JSON",
    "traceloop.entity.input": "JSON", "traceloop.entity.output": "JSON",
    "logfire.msg_template": "VARCHAR", "sdk_span_type": "VARCHAR", "name": "VARCHAR", "to_agent": "VARCHAR",
    "input": "JSON", "output": "JSON", "call_id": "VARCHAR", "codex.tool.phase": "VARCHAR"}');

-- What a span is, by the first convention that says: GenAI operations, OpenInference span kinds, Traceloop
-- span kinds, then the harnesses' span names. NULL: not an agent or tool step.
CREATE OR REPLACE MACRO step_kind(a, span_name, is_root) AS CASE
    WHEN a."gen_ai.operation.name" IN ('invoke_agent', 'create_agent') THEN 'agent'
    WHEN a."gen_ai.operation.name" = 'execute_tool' THEN 'tool'
    WHEN a."gen_ai.operation.name" IN ('agent_handoff', 'handoff') THEN 'handoff'
    WHEN a."gen_ai.operation.name" IN ('execute_task', 'invoke_workflow') THEN 'task'
    WHEN a."gen_ai.operation.name" = 'execute_event_loop_cycle' THEN 'cycle'  -- Strands' agent loop turns
    WHEN a."openinference.span.kind" = 'AGENT' THEN 'agent'
    -- the Agents SDK's OpenInference handoff is a TOOL span "handoff to <agent>"
    WHEN a."openinference.span.kind" = 'TOOL' AND starts_with(lower(span_name), 'handoff') THEN 'handoff'
    WHEN a."openinference.span.kind" = 'TOOL' THEN 'tool'
    -- a trace's root chain is the agent's run (LangGraph's graph, under OpenInference)
    WHEN a."openinference.span.kind" = 'CHAIN' THEN CASE WHEN is_root THEN 'agent' ELSE 'chain' END
    WHEN a."traceloop.span.kind" = 'agent' THEN 'agent'
    WHEN a."traceloop.span.kind" = 'tool' THEN 'tool'
    WHEN a."traceloop.span.kind" IN ('workflow', 'task') THEN a."traceloop.span.kind"
    -- Logfire's OpenAI Agents spans, by their message template
    WHEN starts_with(a."logfire.msg_template", 'Agent run:') THEN 'agent'
    WHEN starts_with(a."logfire.msg_template", 'Function:') THEN 'tool'
    WHEN starts_with(a."logfire.msg_template", 'Handoff:') THEN 'handoff'
    WHEN a."logfire.msg_template" IS NOT NULL AND a."sdk_span_type" = 'turn' THEN 'cycle'
    WHEN a."logfire.msg_template" IS NOT NULL AND a."sdk_span_type" = 'task' THEN 'task'
    -- the coding CLIs' own spans: Codex's tool dispatch, Claude Code's and Qwen Code's turns
    WHEN a."codex.tool.phase" = 'dispatch' THEN 'tool'
    WHEN span_name IN ('claude_code.tool', 'qwen-code.tool') THEN 'tool'
    WHEN span_name IN ('claude_code.interaction', 'qwen-code.interaction') THEN 'agent'
END;

CREATE OR REPLACE MACRO step_convention(a) AS CASE
    WHEN a."gen_ai.operation.name" IS NOT NULL THEN 'genai'
    WHEN a."openinference.span.kind" IS NOT NULL THEN 'openinference'
    WHEN a."traceloop.span.kind" IS NOT NULL THEN 'traceloop'
    WHEN a."logfire.msg_template" IS NOT NULL THEN 'logfire'
    ELSE 'harness'
END;

CREATE OR REPLACE VIEW step_spans AS
WITH candidates AS MATERIALIZED (  -- parsed once: a filter on the struct would parse it again for each field read
    SELECT *, step_attributes_of(attributes) AS a
    FROM spans
    -- a text test first: only spans that may be steps have their attributes parsed
    WHERE contains(attributes::VARCHAR, 'gen_ai.operation.name')
       OR contains(attributes::VARCHAR, 'span.kind')
       OR contains(attributes::VARCHAR, 'logfire.msg_template')
       OR contains(attributes::VARCHAR, 'codex.tool.phase')
       OR name IN ('claude_code.tool', 'claude_code.interaction', 'qwen-code.tool', 'qwen-code.interaction')
),
classified AS (
    SELECT * EXCLUDE (kind), step_kind(a, name, parent_span_id IS NULL) AS kind FROM candidates
)
SELECT
    s.trace_id,
    s.span_id,
    s.parent_span_id,
    s.name,
    s.kind,
    step_convention(s.a) AS convention,
    s.start_time_unix_nano,
    s.end_time_unix_nano,
    s.status_code = 2 OR list_contains(json_extract_string(s.events, '$[*].name'), 'exception') AS is_error,
    CASE WHEN s.kind IN ('agent', 'handoff') THEN coalesce(
        s.a."gen_ai.handoff.to_agent", s.a."to_agent",
        -- the Agents SDK's OpenInference handoff names the target agent as its output
        CASE WHEN s.kind = 'handoff' THEN s.content_attributes ->> 'output.value' END,
        s.a."gen_ai.agent.name", s.a."agent.name", s.a."agent_name", s.a."traceloop.entity.name",
        CASE WHEN s.a."logfire.msg_template" IS NOT NULL THEN s.a."name" END,
        nullif(regexp_extract(s.name, '^([\w-]+)\.interaction$', 1), ''),
        -- CrewAI's OpenInference agent span is "<role>._execute_core"
        nullif(regexp_extract(s.name, '^(.+)\._execute_core$', 1), ''),
        nullif(regexp_replace(s.name, '^(invoke_agent|create_agent) ', ''), '')) END AS agent_name,
    CASE WHEN s.kind = 'tool' THEN coalesce(
        s.a."gen_ai.tool.name", s.a."tool.name", s.a."tool_name", s.a."traceloop.entity.name",
        CASE WHEN s.a."logfire.msg_template" IS NOT NULL THEN s.a."name" END,
        nullif(regexp_replace(s.name, '^execute_tool ', ''), '')) END AS tool_name,
    CASE WHEN s.kind = 'tool' THEN coalesce(
        s.a."gen_ai.tool.call.id", s.a."tool_call.id", s.a."tool.id", s.a."tool_use_id", s.a."call_id")
        END AS tool_call_id,
    CASE WHEN s.kind = 'tool' THEN json_text(coalesce(
        s.a."gen_ai.tool.call.arguments", s.a."tool_arguments", s.a."tool_input",
        s.a."gcp.vertex.agent.tool_call_args", s.content_attributes -> 'input.value',
        s.a."traceloop.entity.input", s.a."input")) END AS arguments,
    CASE WHEN s.kind = 'tool' THEN json_text(coalesce(
        s.a."gen_ai.tool.call.result", s.a."tool_response", s.a."gcp.vertex.agent.tool_response",
        s.content_attributes -> 'output.value', s.a."traceloop.entity.output", s.a."output")) END AS result,
    s.scope_name,
    s.resource_attributes ->> 'service.name' AS service_name
FROM classified s
WHERE s.kind IS NOT NULL;

-- The coding CLIs' tool results, sent as log records: Codex's `codex.tool_result` (tool_name, call_id,
-- arguments, output) and Claude Code's `tool_result` (tool_name, tool_use_id, tool_input). tool_calls joins
-- them to the tool spans (and to the calls that asked) by call id.
CREATE OR REPLACE VIEW harness_tool_results AS
SELECT
    trace_id,
    span_id,
    attributes ->> 'event.name' AS event_name,
    attributes ->> 'tool_name' AS tool_name,
    coalesce(attributes ->> 'call_id', attributes ->> 'tool_use_id') AS tool_call_id,
    coalesce(attributes ->> 'arguments', attributes ->> 'tool_input') AS arguments,
    attributes ->> 'output' AS result,
    rollout_id,
    ns_time(coalesce(nullif(time_unix_nano, 0), observed_time_unix_nano)) AS time
FROM logs
-- a text test first: only tool-result records have their attributes read
WHERE contains(attributes::VARCHAR, 'tool_result')
  AND attributes ->> 'event.name' IN ('codex.tool_result', 'tool_result');
