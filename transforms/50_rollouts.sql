-- rollouts: one row per rollout id, from every span that carries (or inherits) the rollout identity.
-- rollout_rows is what the store keeps (a table maintained as data arrives: each row depends only on its
-- rollout's own records); rollouts reads it with the reward each rollout's training run trains on
-- (reward_specs, reported by a trainer whose spans name no rollout), when queried.

CREATE OR REPLACE VIEW rollout_rows AS
WITH rollout_spans AS (
    -- read several times below, so kept (materialized) with only the columns read: not content or events
    SELECT
        s.trace_id, s.span_id, s.parent_span_id, s.name, s.scope_name, s.status_code, s.start_time_unix_nano,
        s.end_time_unix_nano, s.attributes, s.resource_attributes ->> 'service.name' AS service_name,
        i.rollout_id, i.attempt_id, i.group_id, i.task_id, i.split, s.sender,
        -- "latest" is by the server's receive order (the writer's commit), never by a sender's clock; spans
        -- of one commit by their start
        {'commit_seq': s.commit_seq, 'start': s.start_time_unix_nano} AS received
    FROM spans s JOIN span_identity i USING (trace_id, span_id)
    WHERE i.rollout_id IS NOT NULL
),
-- The rollout's own spans, latest first: the controller's otel_rl.rollout span (one per attempt), sent by a
-- sender the server vouches for (the same span from a rollout key is the harness's claim, not a status), and
-- the SDK's rollout span opened by otel_rl.rollout().
controller_attempts AS (
    SELECT
        rollout_id,
        arg_max(attempt_id, received) AS attempt_id,
        arg_max(coalesce(attributes ->> 'otel_rl.rollout.status',
                         CASE WHEN status_code = 2 THEN 'error' ELSE 'ok' END),
                received) AS status,
        arg_max(TRY_CAST(attributes ->> 'otel_rl.rollout.exit_code' AS INTEGER), received) AS exit_code
    FROM rollout_spans
    WHERE scope_name = 'otel_rl.controller' AND name = 'otel_rl.rollout' AND vouched(sender)
    GROUP BY rollout_id
),
sdk_spans AS (
    SELECT
        rollout_id,
        arg_max(attempt_id, received) AS attempt_id,
        arg_max(CASE WHEN status_code = 2 THEN 'error' ELSE 'ok' END, received) AS status
    FROM rollout_spans
    WHERE scope_name = 'otel_rl.sdk' AND name = 'rollout'
    GROUP BY rollout_id
),
summary AS (
    SELECT
        rollout_id,
        arg_max(attempt_id, received) FILTER (WHERE attempt_id IS NOT NULL) AS attempt_id,
        min_by(group_id, start_time_unix_nano) FILTER (WHERE group_id IS NOT NULL) AS group_id,
        min_by(task_id, start_time_unix_nano) FILTER (WHERE task_id IS NOT NULL) AS task_id,
        min_by(split, start_time_unix_nano) FILTER (WHERE split IS NOT NULL) AS split,
        min(start_time_unix_nano) AS start_time_unix_nano,
        max(end_time_unix_nano) AS end_time_unix_nano,
        -- the harness's service, not the controller's or the gateway's
        coalesce(min_by(service_name, start_time_unix_nano)
                     FILTER (WHERE scope_name NOT IN ('otel_rl.controller', 'otel_rl.gateway')),
                 min_by(service_name, start_time_unix_nano)) AS service_name,
        list(DISTINCT trace_id ORDER BY trace_id) AS trace_ids,
        -- A zero-code harness has no rollout span: its finished work shows as trace roots.
        bool_or(parent_span_id IS NULL) AS has_root_span,
        bool_or(parent_span_id IS NULL AND status_code = 2) AS has_failed_root_span
    FROM rollout_spans
    GROUP BY rollout_id
),
-- Every call span, read twice: for the counts and to tell outcome rewards from turn rewards.
call_index AS MATERIALIZED (
    SELECT trace_id, span_id, rollout_id, is_error, policy_version, gateway_call FROM llm_call_index
),
calls AS (
    SELECT
        rollout_id,
        count(*) AS n_calls,
        count(*) FILTER (WHERE is_error) AS n_error_calls,
        min(policy_version) AS policy_version_min,
        max(policy_version) AS policy_version_max
    FROM call_index
    WHERE rollout_id IS NOT NULL AND gateway_call IS NULL  -- the rows of llm_calls
    GROUP BY rollout_id
),
-- The rewards view's outcome rows, under every name, placed there (40_rewards.sql). The latest by the
-- server's receive order, never by the sender's clock.
outcome_records AS MATERIALIZED (
    SELECT rollout_id, coalesce(name, '(none)') AS name, coalesce(source, '(none)') AS source,
           value, vouched,
           {'received_at': received_at, 'seq': coalesce(seq, 0)} AS received
    FROM rewards
    WHERE level = 'outcome' AND rollout_id IS NOT NULL
),
-- Per name and source (a record sent without one under '(none)', as the reports name it): its latest record
-- (`value`, `vouched`: what the rollout page shows), and what any aggregation rule needs of its numeric
-- values (the latest and when it came, count, sum, max), so that rollouts combines the trusted sources'
-- by the rule of the run's reward when queried (trusted_reward()).
source_outcomes AS (
    SELECT
        rollout_id,
        name,
        source,
        arg_max({'value': value, 'vouched': vouched}, received) AS latest,
        arg_max(value, received) FILTER (WHERE value IS NOT NULL) AS last,
        max(received) FILTER (WHERE value IS NOT NULL) AS last_received,
        count(value) AS n,
        sum(value) AS total,
        max(value) AS top
    FROM outcome_records
    GROUP BY rollout_id, name, source
),
outcomes AS (
    SELECT rollout_id, list({'name': name, 'sources': sources} ORDER BY name) AS outcome_reward_stats
    FROM (
        SELECT rollout_id, name,
               list({'source': source, 'value': latest.value, 'vouched': latest.vouched, 'last': last,
                     'last_received': last_received, 'n': n, 'total': total, 'top': top} ORDER BY source)
                   AS sources
        FROM source_outcomes
        GROUP BY rollout_id, name
    )
    GROUP BY rollout_id
)

SELECT
    s.rollout_id,
    coalesce(ca.attempt_id, sdk.attempt_id, s.attempt_id) AS attempt_id,
    s.group_id,
    s.task_id,
    s.split,
    -- the controller knows timeouts and crashes; the SDK span knows whether the harness block raised;
    -- with neither, the rollout is still running unless a zero-code harness's root spans have ended
    coalesce(
        ca.status,
        sdk.status,
        CASE WHEN s.has_failed_root_span THEN 'error' WHEN s.has_root_span THEN 'ok' ELSE 'running' END
    ) AS status,
    ca.exit_code,
    ns_time(s.start_time_unix_nano) AS started_at,
    ns_time(s.end_time_unix_nano) AS ended_at,
    -- greatest(): rows stored before ingest set an end before its start to the start
    (greatest(s.end_time_unix_nano, s.start_time_unix_nano) - s.start_time_unix_nano) / 1e6 AS duration_ms,
    coalesce(c.n_calls, 0) AS n_calls,
    coalesce(c.n_error_calls, 0) AS n_error_calls,
    s.service_name,
    s.trace_ids,
    c.policy_version_min,
    c.policy_version_max,
    -- every outcome reward by name and source (rollouts reads it): [{name, sources: [{source, value,
    -- vouched, last, last_received, n, total, top}]}]
    o.outcome_reward_stats
FROM summary s
LEFT JOIN controller_attempts ca USING (rollout_id)
LEFT JOIN sdk_spans sdk USING (rollout_id)
LEFT JOIN calls c USING (rollout_id)
LEFT JOIN outcomes o USING (rollout_id);

-- The reward each rollout's training run trains on (reward_specs): the run's id prefixes every group id of
-- the run (a step's, an evaluation's, a probe's: `<run_id>-...`; the longest such id when several do); a
-- rollout of no reporting run follows training's default (default_reward_spec(): `outcome`, trusted from
-- `grader`, rule `last`).
CREATE OR REPLACE VIEW rollouts AS
WITH group_specs AS (
    SELECT g.group_id, arg_max(struct_insert(r.spec, run_id := r.run_id), length(r.run_id)) AS spec
    FROM (SELECT DISTINCT group_id FROM rollout_rows WHERE group_id IS NOT NULL) g
    JOIN reward_specs r ON starts_with(g.group_id, r.run_id || '-')
    GROUP BY g.group_id
),
specified AS (
    SELECT r.*, coalesce(g.spec, struct_insert(default_reward_spec(), run_id := NULL::VARCHAR)) AS spec
    FROM rollout_rows r
    LEFT JOIN group_specs g USING (group_id)
)
SELECT
    rollout_id, attempt_id, group_id, task_id, split, status, exit_code, started_at, ended_at, duration_ms,
    n_calls, n_error_calls,
    [trusted_reward(e.sources, spec) FOR e IN outcome_reward_stats IF e.name = spec.name][1] AS outcome_reward,
    service_name, trace_ids, policy_version_min, policy_version_max,
    [map_from_entries([{'k': s.source, 'v': s.value} FOR s IN e.sources])
     FOR e IN outcome_reward_stats IF e.name = spec.name][1] AS outcome_rewards_by_source,
    map_from_entries([
        {'k': e.name,
         'v': {'trusted': trusted_reward(e.sources, spec),
               'sources': [{'source': s.source, 'value': s.value, 'vouched': s.vouched} FOR s IN e.sources]}}
        FOR e IN outcome_reward_stats]) AS outcome_rewards_by_name,
    -- the reward outcome_reward is: {name, rule, trusted_sources, run_id}; run_id NULL: training's default
    spec AS outcome_reward_spec
FROM specified;
