-- reward_specs: the reward each online training run trains on, as its trainer reported it (a training
-- config's `reward` section: name, rule, trusted sources), one row per run. The trainer puts it on its
-- otel_rl.train.run span (sent at the run's start) and on every step and evaluation span; the latest one the
-- server received counts. Only from a sender the server vouches for (the admin token's holder): a rollout key
-- sending the same attributes cannot change which reward the rollouts view shows.

CREATE OR REPLACE VIEW reward_specs AS
WITH reported AS (
    SELECT
        attributes ->> 'otel_rl.train.run_id' AS run_id,
        {'name': attributes ->> 'otel_rl.train.reward.name',
         'rule': attributes ->> 'otel_rl.train.reward.rule',
         'trusted_sources': TRY_CAST(attributes -> 'otel_rl.train.reward.trusted_sources' AS VARCHAR[])} AS spec,
        -- the server's receive order (the writer's commit), never the sender's clock
        {'commit_seq': commit_seq, 'start': start_time_unix_nano} AS received
    FROM spans
    WHERE scope_name = 'otel_rl.train' AND vouched(sender)
      AND attributes ->> 'otel_rl.train.reward.name' IS NOT NULL
)
SELECT run_id, arg_max(spec, received) AS spec
FROM reported
-- what training itself would refuse (RewardSpec, RewardSettings) is no reward spec
WHERE run_id IS NOT NULL AND spec.rule IN ('last', 'mean', 'max', 'sum') AND len(spec.trusted_sources) > 0
GROUP BY run_id;
