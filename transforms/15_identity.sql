-- Rollout identity of every span (ARCHITECTURE.md "Rollout identity"): the span's own attributes (set on the
-- rollout's root span and copied from W3C baggage onto its descendants), else its resource attributes
-- (OTEL_RESOURCE_ATTRIBUTES, the zero-code path), else the value carried by the earliest span of the same
-- trace that has one (spans of libraries that do not copy baggage, e.g. a gateway continuing the trace).
CREATE OR REPLACE MACRO identity_of(attributes) AS from_json(attributes, '{
    "otel_rl.rollout.id": "VARCHAR", "otel_rl.attempt.id": "VARCHAR", "otel_rl.group.id": "VARCHAR",
    "otel_rl.task.id": "VARCHAR", "otel_rl.split": "VARCHAR"}');

CREATE OR REPLACE VIEW span_identity AS
WITH parsed AS (
    -- one parse per document for the five keys (each `->>` would parse the whole document again), and
    -- none for documents without an otel_rl key (a text test is much cheaper than a parse)
    SELECT
        trace_id,
        span_id,
        start_time_unix_nano,
        CASE WHEN contains(attributes::VARCHAR, '"otel_rl.') THEN identity_of(attributes) END AS a,
        CASE WHEN contains(resource_attributes::VARCHAR, '"otel_rl.')
             THEN identity_of(resource_attributes) END AS r
    FROM spans
),
own AS (
    SELECT
        trace_id,
        span_id,
        start_time_unix_nano,
        coalesce(a."otel_rl.rollout.id", r."otel_rl.rollout.id") AS rollout_id,
        coalesce(a."otel_rl.attempt.id", r."otel_rl.attempt.id") AS attempt_id,
        coalesce(a."otel_rl.group.id", r."otel_rl.group.id") AS group_id,
        coalesce(a."otel_rl.task.id", r."otel_rl.task.id") AS task_id,
        coalesce(a."otel_rl.split", r."otel_rl.split") AS split
    FROM parsed
),
per_trace AS (
    SELECT
        trace_id,
        min_by(rollout_id, start_time_unix_nano) FILTER (WHERE rollout_id IS NOT NULL) AS rollout_id,
        min_by(attempt_id, start_time_unix_nano) FILTER (WHERE attempt_id IS NOT NULL) AS attempt_id,
        min_by(group_id, start_time_unix_nano) FILTER (WHERE group_id IS NOT NULL) AS group_id,
        min_by(task_id, start_time_unix_nano) FILTER (WHERE task_id IS NOT NULL) AS task_id,
        min_by(split, start_time_unix_nano) FILTER (WHERE split IS NOT NULL) AS split
    FROM own
    GROUP BY trace_id
)
SELECT
    own.trace_id,
    own.span_id,
    coalesce(own.rollout_id, per_trace.rollout_id) AS rollout_id,
    coalesce(own.attempt_id, per_trace.attempt_id) AS attempt_id,
    coalesce(own.group_id, per_trace.group_id) AS group_id,
    coalesce(own.task_id, per_trace.task_id) AS task_id,
    coalesce(own.split, per_trace.split) AS split
FROM own
LEFT JOIN per_trace USING (trace_id);
