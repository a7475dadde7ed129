"""`otel-rl demo --quick`: every stage of the demo runs through the real server, gateway, vLLM, harnesses."""

import json
import subprocess
import sys
from pathlib import Path

from test_vllm import reload_weights  # vLLM's run-time reload through its dev endpoints

from otel_rl.demo import QUICK
from otel_rl.query import query

OTEL_RL = Path(sys.executable).parent / "otel-rl"


def test_quick_demo_trains_through_the_whole_pipeline_and_reports(vllm_server, tiny_model_dir, tmp_path):
    workdir = tmp_path / "demo"
    try:
        done = subprocess.run(
            [str(OTEL_RL), "demo", "--quick", "--workdir", str(workdir), "--vllm", vllm_server.url],
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        reload_weights(vllm_server, tiny_model_dir)  # the session's server serves the base weights
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "held-out greedy success" in done.stdout and "otel-rl sql --db" in done.stdout

    report = json.loads((workdir / "report.json").read_text())
    assert report["steps"] == QUICK.rl_steps
    assert 0 <= report["success_before"] <= 1 and 0 <= report["success_after"] <= 1
    assert report["wall_seconds"] > 0
    assert (workdir / "reward_curve.png").read_bytes().startswith(b"\x89PNG")
    assert "otel-rl sql" in (workdir / "report.md").read_text()
    # Every update trained on what vLLM served: float32 both sides, so the logprobs agree.
    assert all(step["trainer"]["mismatch"] < 1e-4 for step in report["train_steps"])

    def sql(statement: str) -> list[tuple]:
        return query(statement, db=workdir / "otel_rl.duckdb").rows()

    expert = sql("SELECT count(*), avg(outcome_reward) FROM rollouts WHERE service_name = 'expert_agent'")
    assert expert[0][0] == QUICK.expert_rollouts and 0.3 < expert[0][1] < 0.8  # noisy on purpose
    trained = QUICK.rl_steps * QUICK.groups_per_step * QUICK.group_size
    assert sql("SELECT count(*) FROM rollouts WHERE split = 'train' AND status = 'ok'")[0][0] >= trained
    assert sql("SELECT count(*) FROM rollouts WHERE split = 'val'")[0][0] == 2 * QUICK.val_tasks
    versions = sql("SELECT DISTINCT policy_version FROM llm_calls WHERE split = 'train' ORDER BY 1")
    assert len(versions) >= 2  # the harnesses were served by successive reloaded policies
