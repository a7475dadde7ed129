-- agent_steps: one row per agent invocation, handoff, workflow, task or chain step a framework traced, with
-- the rollout of its trace (docs/views.md "agent_steps").

CREATE OR REPLACE VIEW agent_steps AS
WITH steps AS (
    SELECT * FROM step_spans WHERE kind <> 'tool'
)
SELECT
    i.rollout_id,
    i.attempt_id,
    i.group_id,
    i.task_id,
    i.split,
    s.trace_id,
    s.span_id,
    s.parent_span_id,
    s.kind,
    s.agent_name,
    s.name,
    ns_time(s.start_time_unix_nano) AS started_at,
    ns_time(s.end_time_unix_nano) AS ended_at,
    s.start_time_unix_nano,
    (greatest(s.end_time_unix_nano, s.start_time_unix_nano) - s.start_time_unix_nano) / 1e6 AS duration_ms,
    s.is_error,
    s.convention,
    s.scope_name,
    s.service_name
FROM steps s
LEFT JOIN span_identity i USING (trace_id, span_id)
-- One invocation recorded twice (LangGraph under Traceloop: a GenAI invoke_agent span around the workflow
-- span of the same agent) is its outer span.
ANTI JOIN steps p ON p.trace_id = s.trace_id AND p.span_id = s.parent_span_id
    AND p.kind = s.kind AND p.agent_name = s.agent_name;
