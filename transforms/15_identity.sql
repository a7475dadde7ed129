-- Rollout identity of every span (ARCHITECTURE.md "Rollout identity"). The collector resolves it once, at
-- ingest, into the raw tables' identity columns (rollout_id, attempt_id, group_id, task_id, split: a rollout
-- key's own, else the record's attribute, else its resource's; otel_rl/store/identity.py). The views add one
-- rule, inheritance within a trace: a span that names no rollout (a library that does not copy baggage, e.g.
-- a gateway continuing the trace) takes its trace's rollout when the trace's spans name exactly one (a span of
-- another rollout placed in the trace must not take the trace's other spans into its rollout), and the other
-- keys a span lacks come from the earliest span of the same trace and rollout, never from another rollout's.
-- (Records sent with a rollout key always name its rollout: they are never placed by their trace.)
CREATE OR REPLACE VIEW trace_rollouts AS
SELECT trace_id, any_value(rollout_id) AS rollout_id
FROM spans
WHERE rollout_id IS NOT NULL
GROUP BY trace_id
HAVING count(DISTINCT rollout_id) = 1;

CREATE OR REPLACE VIEW span_identity AS
WITH placed AS (
    SELECT
        s.trace_id,
        s.span_id,
        s.start_time_unix_nano,
        coalesce(s.rollout_id, t.rollout_id) AS rollout_id,
        s.attempt_id,
        s.group_id,
        s.task_id,
        s.split
    FROM spans s
    LEFT JOIN trace_rollouts t USING (trace_id)
),
per_rollout AS (
    SELECT
        trace_id,
        rollout_id,
        min_by(attempt_id, start_time_unix_nano) FILTER (WHERE attempt_id IS NOT NULL) AS attempt_id,
        min_by(group_id, start_time_unix_nano) FILTER (WHERE group_id IS NOT NULL) AS group_id,
        min_by(task_id, start_time_unix_nano) FILTER (WHERE task_id IS NOT NULL) AS task_id,
        min_by(split, start_time_unix_nano) FILTER (WHERE split IS NOT NULL) AS split
    FROM placed
    GROUP BY trace_id, rollout_id
)
SELECT
    p.trace_id,
    p.span_id,
    p.rollout_id,
    coalesce(p.attempt_id, r.attempt_id) AS attempt_id,
    coalesce(p.group_id, r.group_id) AS group_id,
    coalesce(p.task_id, r.task_id) AS task_id,
    coalesce(p.split, r.split) AS split
FROM placed p
LEFT JOIN per_rollout r ON r.trace_id = p.trace_id AND r.rollout_id IS NOT DISTINCT FROM p.rollout_id;
