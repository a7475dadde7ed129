"""What the demo leaves to look at: the reward curve, a Markdown report, and SQL to look inside the store."""

from pathlib import Path
from typing import Any


def plot_rewards(report: dict[str, Any], path: Path) -> Path:
    """Training reward and success per step, and held-out success at the evaluations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [record["step"] for record in report["train_steps"]]
    success = [record["success_rate"] for record in report["train_steps"]]
    # Each step sees only a few tasks (an easy + group or a hard *), so show a running mean over 5 steps too.
    window = [success[max(0, i - 4) : i + 1] for i in range(len(success))]
    figure, axis = plt.subplots(figsize=(7, 4))
    axis.plot(steps, success, marker=".", alpha=0.35, label="train success per step (sampled)")
    axis.plot(steps, [sum(w) / len(w) for w in window], label="train success, mean of last 5 steps")
    for name, marker in (("greedy", "o"), ("sampled", "s")):
        evals = [e for e in report["evals"] if e["name"] == name]
        axis.plot(
            [e["step"] for e in evals],
            [e["success_rate"] for e in evals],
            marker=marker,
            markersize=9,
            linestyle="none",
            label=f"held-out success ({name})",
        )
    axis.set_xlabel("RL step (policy version)")
    axis.set_ylabel("success rate")
    axis.set_ylim(0, 1)
    axis.grid(alpha=0.3)
    axis.legend()
    axis.set_title("otel-rl demo: calculator agent, online GRPO")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


SQL_TO_TRY = (
    # the demo trusts its harness's rewards (outcome_reward is a grader's: none here)
    ("rollouts by split and status", "SELECT split, status, count(*) AS n, "
     "avg(outcome_rewards_by_source['harness']) AS reward FROM rollouts GROUP BY ALL ORDER BY ALL"),
    ("train reward by policy version", "SELECT policy_version_max AS version, count(*) AS rollouts, "
     "avg(outcome_rewards_by_source['harness']) AS reward FROM rollouts WHERE split = 'train' "
     "AND policy_version_max IS NOT NULL GROUP BY 1 ORDER BY 1"),
    ("one multi-turn rollout, call by call", "SELECT rollout_id, policy_version, output_messages "
     "FROM llm_calls WHERE rollout_id = (SELECT rollout_id FROM llm_calls WHERE split = 'val' LIMIT 1) "
     "ORDER BY start_time_unix_nano"),
    ("training steps", "SELECT attributes->>'otel_rl.train.step' AS step, "
     "attributes->>'otel_rl.train.reward_mean' AS reward, attributes->>'otel_rl.train.trainer.mismatch' "
     "AS mismatch FROM spans WHERE name = 'otel_rl.train.step' AND sender IN ('server', 'admin') "
     # the online steps: stage 1's SFT records its updates too (no rollouts of their own, so no reward)
     "AND attributes->>'otel_rl.train.reward_mean' IS NOT NULL ORDER BY commit_seq, start_time_unix_nano"),
)  # fmt: skip


def markdown_report(report: dict[str, Any]) -> str:
    """A short human-readable report: results, timings, and SQL to look inside."""
    lines = [
        "# otel-rl demo report",
        "",
        f"- held-out success (greedy, {report['evals'][0]['rollouts']} problems): "
        f"{report['success_before']:.1%} before RL, {report['success_after']:.1%} after "
        f"{report['steps']} steps",
        f"- held-out success (sampled at temperature 1): {report['sampled_success_before']:.1%} before RL, "
        f"{report['sampled_success_after']:.1%} after",
        f"- wall time: {report['wall_seconds']:.0f} s "
        + ", ".join(
            f"{name.removesuffix('_s')} {seconds:.0f} s" for name, seconds in report["timings"].items()
        ),
        "- reward curve: reward_curve.png; every number: report.json",
        "",
        "## Look inside (the server has stopped; these read the DuckDB file)",
        "",
    ]
    for title, sql in SQL_TO_TRY:
        lines += [f"{title}:", "", f'    otel-rl sql --db {report["store"]} "{sql}"', ""]
    return "\n".join(lines)
