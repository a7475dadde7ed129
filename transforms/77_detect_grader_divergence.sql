-- detect_grader_divergence: the harness says pass and the grader says fail. The latest outcome reward of each
-- name from source `harness` is a pass (> 0.5) while the latest of the same name from source `grader` is not
-- (<= 0.5): the agent's own check passed what the hidden tests, run outside its sandbox, failed.

CREATE OR REPLACE VIEW detect_grader_divergence AS
WITH latest AS (
    SELECT
        rollout_id,
        name,
        source,
        arg_max({'value': value, 'trace_id': trace_id, 'span_id': span_id}, (received_at, coalesce(seq, 0))) AS reward
    FROM rewards
    WHERE level = 'outcome' AND source IN ('harness', 'grader') AND value IS NOT NULL AND rollout_id IS NOT NULL
    GROUP BY rollout_id, name, source
)
SELECT
    h.rollout_id,
    'grader_divergence' AS detector,
    g.reward.span_id AS evidence_id,
    format('{}: harness {}, grader {}', h.name, h.reward.value, g.reward.value) AS evidence,
    g.reward.trace_id AS trace_id,
    g.reward.span_id AS span_id
FROM latest h
JOIN latest g ON g.rollout_id = h.rollout_id AND g.name = h.name AND g.source = 'grader'
WHERE h.source = 'harness' AND h.reward.value > 0.5 AND g.reward.value <= 0.5;
