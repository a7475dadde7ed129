-- Rollout identity of every span (ARCHITECTURE.md "Rollout identity"): the span's own attributes (set on the
-- rollout's root span and copied from W3C baggage onto its descendants), else its resource attributes
-- (OTEL_RESOURCE_ATTRIBUTES, the zero-code path), else its trace's rollout, for spans of libraries that do not
-- copy baggage (e.g. a gateway continuing the trace). A trace's rollout is the one its spans name when they
-- name exactly one: a span of another rollout placed in the trace must not take the trace's other spans into
-- its rollout. The other keys missing on a span come from the earliest span of the same trace and rollout,
-- never from another rollout's. (Records sent with a rollout key always name its rollout: the collector
-- stamps them, so they are never placed by their trace.)
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
trace_rollout AS (
    SELECT trace_id, CASE WHEN count(DISTINCT rollout_id) = 1 THEN any_value(rollout_id) END AS rollout_id
    FROM own
    WHERE rollout_id IS NOT NULL
    GROUP BY trace_id
),
placed AS (
    SELECT own.* REPLACE (coalesce(own.rollout_id, t.rollout_id) AS rollout_id)
    FROM own
    LEFT JOIN trace_rollout t USING (trace_id)
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
