"""`otel-rl demo --quick` runs every stage through the real server, gateway, vLLM and harnesses; then the
offline modes of `otel-rl train` learn from the store it leaves."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_ui_pages import run_checking_the_view

from otel_rl.demo import QUICK, WORKDIR
from otel_rl.query import query

OTEL_RL = Path(sys.executable).parent / "otel-rl"
REPOSITORY = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quick_demo() -> tuple[Path, subprocess.CompletedProcess]:
    """The quick demo exactly as a user types it: from the repository root, every default (its own vLLM, its
    working folder `.otel_rl/demo` relative to where it runs). It ends serving the web view: its pages are
    checked in headless Chromium against that live server (test_ui_pages.py), then Ctrl-C stops it cleanly."""
    done = run_checking_the_view([str(OTEL_RL), "demo", "--quick"], cwd=REPOSITORY, timeout_s=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return REPOSITORY / WORKDIR, done


def test_quick_demo_trains_through_the_whole_pipeline_and_reports(quick_demo):
    workdir, done = quick_demo
    assert "held-out greedy success" in done.stdout and "otel-rl sql --db" in done.stdout

    report = json.loads((workdir / "report.json").read_text())
    assert report["steps"] == QUICK.rl_steps and report["seed"] == 0
    evals = report["evals"]
    assert [(e["name"], e["step"], e["rollouts"]) for e in evals] == [
        (name, step, QUICK.val_tasks) for step in (0, QUICK.rl_steps) for name in ("greedy", "sampled")
    ]
    # What the user reads: the printed before → after lines are the evaluations' own figures.
    for name, before, after in (("greedy", evals[0], evals[2]), ("sampled", evals[1], evals[3])):
        line = f"held-out {name} success: {before['success_rate']:.1%} → {after['success_rate']:.1%}"
        assert line in done.stdout, done.stdout[-2000:]
    assert (report["success_before"], report["success_after"]) == (
        evals[0]["success_rate"],
        evals[2]["success_rate"],
    )
    assert (report["sampled_success_before"], report["sampled_success_after"]) == (
        evals[1]["success_rate"],
        evals[3]["success_rate"],
    )
    assert f"whole demo {report['wall_seconds']:.0f} s" in done.stdout
    assert report["wall_seconds"] >= sum(report["timings"].values())
    assert (workdir / "reward_curve.png").read_bytes().startswith(b"\x89PNG")
    assert "otel-rl sql" in (workdir / "report.md").read_text()
    # Every update trained on what vLLM served: float32 on both sides, so the logprobs agree.
    assert all(step["trainer"]["mismatch"] < 1e-4 for step in report["train_steps"])

    def sql(statement: str) -> list[tuple]:
        return query(statement, db=workdir / "otel_rl.duckdb").rows()

    # The expert's printed success is its rollouts' harness rewards in the store.
    expert = sql(
        "SELECT count(*), avg(outcome_rewards_by_source['harness']) FROM rollouts"
        " WHERE service_name = 'expert_agent'"
    )
    assert report["expert"] == {"rollouts": QUICK.expert_rollouts, "mean_reward": pytest.approx(expert[0][1])}
    assert expert[0][0] == QUICK.expert_rollouts
    assert (
        f"expert: {QUICK.expert_rollouts} rollouts, success {report['expert']['mean_reward']:.1%}"
        in done.stdout
    )
    # Each step (its printed line, its record) trained on the rollouts of the groups it recorded in the store:
    # B groups, their rollouts and their mean harness reward.
    trained = sql(
        "WITH trained AS (SELECT (attributes->>'otel_rl.train.step')::INTEGER AS step,"
        " unnest(CAST(attributes->'otel_rl.train.group_ids' AS VARCHAR[])) AS group_id FROM spans"
        " WHERE name = 'otel_rl.train.step' AND sender IN ('server', 'admin')"
        " AND attributes->>'otel_rl.train.reward_mean' IS NOT NULL)"  # stage 1's SFT updates have none
        " SELECT step, count(DISTINCT group_id), count(*), avg(outcome_rewards_by_source['harness'])"
        " FROM trained JOIN rollouts USING (group_id) WHERE status = 'ok' GROUP BY step ORDER BY step"
    )
    steps = report["train_steps"]
    assert trained == [
        (s["step"], QUICK.groups_per_step, s["rollouts"], pytest.approx(s["reward_mean"])) for s in steps
    ]
    for s in steps:
        assert (
            f"step {s['step']:>4}  reward {s['reward_mean']:.3f}  success {s['success_rate']:6.1%}"
            in done.stdout
        )
    assert sql("SELECT count(*) FROM rollouts WHERE split = 'val'")[0][0] == 4 * QUICK.val_tasks
    # Each evaluation's success rate is what its rollouts' harness rewards in the store say.
    stored = sql(
        "SELECT group_id, avg(CASE WHEN outcome_rewards_by_source['harness'] >= 1 THEN 1 ELSE 0 END)"
        " FROM rollouts WHERE split = 'val' GROUP BY group_id ORDER BY min(started_at)"
    )
    for name in ("greedy", "sampled"):
        assert [rate for group, rate in stored if f"-{name}-" in group] == pytest.approx(
            [e["success_rate"] for e in evals if e["name"] == name]
        )
    # The harnesses were forked warm from a fork server (the `preload` setting), one log per attempt.
    assert (workdir / "rl" / "rollouts" / "forkserver.log").is_file()
    # The gateway served the run's start policy, then reloaded exactly the versions the steps produced, in
    # order; the evaluations were served by the versions they report, the harnesses by these versions only.
    start = evals[0]["policy_version"]
    produced = [s["policy_version"] for s in steps]
    assert produced == list(range(start + 1, start + 1 + QUICK.rl_steps))
    reloads = sql(
        "SELECT (attributes->>'otel_rl.policy.version')::INTEGER, status_code FROM spans"
        " WHERE name = 'otel_rl.reload' AND sender IN ('server', 'admin')"
        " ORDER BY commit_seq, start_time_unix_nano"
    )
    assert reloads == [(version, 0) for version in (start, *produced)]  # status 0: no server failed
    val = sql("SELECT DISTINCT policy_version FROM llm_calls WHERE split = 'val' ORDER BY 1")
    assert val == [(start,), (produced[-1],)] == sorted({(e["policy_version"],) for e in evals})
    served = sql(  # the gateway's calls: the expert's (train split too) went to its scripted model
        "SELECT DISTINCT policy_version FROM llm_calls WHERE split = 'train' AND dialect = 'gateway'"
        " ORDER BY 1"
    )
    assert served[0] == (start,) and {version for (version,) in served} <= {start, *produced}


def offline_config(workdir: Path, output: Path) -> Path:
    path = output.parent / f"{output.name}.yaml"
    path.write_text(
        f"model: {workdir / 'model-init'}\noutput_dir: {output}\nsteps: 2\n"
        f"server: {{db: {workdir / 'otel_rl.duckdb'}}}\n"
        "reward: {trusted_sources: [harness]}\nalgorithm: {groups_per_step: 1}\n"
    )
    return path


def test_offline_rl_on_stored_rollouts_is_importance_corrected_against_their_logprobs(quick_demo, tmp_path):
    workdir, _ = quick_demo
    config = offline_config(workdir, tmp_path / "offline")
    where = "split = 'train' AND group_id IS NOT NULL"
    done = subprocess.run(
        [str(OTEL_RL), "train", "--config", str(config), "--offline", "--where", where],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "offline" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    # The stored rollouts were sampled by the fine-tuned policies, not by the untrained model trained here.
    assert all(m["mismatch"] > 0.01 and 0 < m["is_weight_mean"] <= 2 for m in metrics)
    assert (tmp_path / "offline" / "step-2" / "model.safetensors").is_file()


def test_sft_from_traces_keeps_only_rollouts_above_the_reward_threshold(quick_demo, tmp_path):
    workdir, _ = quick_demo
    config = offline_config(workdir, tmp_path / "sft")
    where = "service_name = 'expert_agent'"
    command = [str(OTEL_RL), "train", "--config", str(config), "--sft", "--where", where, "--min-reward", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    successes = query(
        f"SELECT count(*) FROM rollouts WHERE {where} AND outcome_rewards_by_source['harness'] >= 1",
        db=workdir / "otel_rl.duckdb",
    )
    assert f"{successes.item()} conversations for SFT" in done.stdout
    losses = [
        json.loads(line)["loss"] for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()
    ]
    assert len(losses) == 2 and (tmp_path / "sft" / "step-2" / "tokenizer.json").is_file()
