"""otel-rl tasks probe on real parts: the tiny model on real vLLM behind a real `otel-rl serve`, the local
controller running a harness in bubblewrap per probe, the grader outside posting `grader` rewards; then
otel-rl tasks curate selects from that probe run's rewards in the store."""

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from coding_tasks import calc_task_file
from otel_rl_server import ServerProcess

HARNESS = Path(__file__).parent / "harnesses" / "probe_coder.py"
OTEL_RL = str(Path(sys.executable).with_name("otel-rl"))
K = 2


@pytest.fixture(scope="module")
def server(vllm_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("coding_probe")
    process = ServerProcess(workdir / "otel_rl.duckdb", workdir, flags=("--vllm", vllm_server.url)).start()
    yield process
    process.stop()


def task_file(root: Path) -> Path:
    """calc-1 (its hidden tests fail until add() is fixed: a notes file never fixes it) and calc-passing (the
    same repository, graded on its visible test only: it passes whatever a note says)."""
    path = calc_task_file(root)
    [line] = path.read_text().splitlines()
    passing = json.loads(line) | {
        "instance_id": "calc-passing",
        "FAIL_TO_PASS": ["tests/test_mul.py::TestMul::test_mul"],
        "PASS_TO_PASS": [],
        "test_patch": "",
    }
    path.write_text(line + "\n" + json.dumps(passing) + "\n")
    return path


def config_file(root: Path, server: ServerProcess) -> Path:
    config = {
        "model": str(root / "model"),
        "output_dir": str(root / "out"),
        "server": {"url": server.http_url, "token": server.token},
        "online": {"harness": [sys.executable, str(HARNESS), "tiny"], "timeout_s": 120},
        # `tasks` is the probed file's: the command sets it
        "controller": {
            "coding": {"tasks": "unused.jsonl", "binds": [str(HARNESS.parent)], "cpu_seconds": 60}
        },
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def otel_rl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([OTEL_RL, *args], capture_output=True, text=True, timeout=600)


def test_probe_runs_k_graded_rollouts_a_task_and_curate_selects_from_that_probe_run(
    server: ServerProcess, tmp_path: Path
) -> None:
    tasks = task_file(tmp_path)
    config = config_file(tmp_path, server)
    done = otel_rl("tasks", "probe", str(tasks), "-c", str(config), "--k", str(K), "--probe-id", "probe-one")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines == [
        {"probe_id": "probe-one", "instance_id": task, "rollouts": K, "statuses": {"ok": K}}
        for task in ("calc-1", "calc-passing")
    ]

    rows = server.run(
        "SELECT r.task_id, r.split, r.group_id, r.outcome_reward, r.n_calls, "
        "r.outcome_rewards_by_source['grader'] AS grader FROM rollouts r "
        "WHERE starts_with(r.group_id, 'probe-one-') ORDER BY r.task_id"
    ).to_dicts()
    assert [row["task_id"] for row in rows] == ["calc-1"] * K + ["calc-passing"] * K
    assert {row["split"] for row in rows} == {"val"}  # never trained on
    assert len({row["group_id"] for row in rows}) == 2  # one group a task
    # each probe called the real model through the gateway; the grader's reward is the trusted one
    assert all(row["n_calls"] == 1 for row in rows), rows
    assert [row["outcome_reward"] for row in rows] == [0.0] * K + [1.0] * K
    assert [row["grader"] for row in rows] == [row["outcome_reward"] for row in rows]
    models = server.run(
        "SELECT DISTINCT c.response_model FROM llm_calls c JOIN rollouts r USING (rollout_id) "
        "WHERE starts_with(r.group_id, 'probe-one-')"
    )["response_model"].to_list()
    assert models == ["tiny"]

    curated = tmp_path / "curated.jsonl"
    common = ("--out", str(curated), "--server", server.http_url, "--token", server.token)
    done = otel_rl("tasks", "curate", str(tasks), "--probe-id", "probe-one", *common)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["dropped"] == {
        "calc-1": "always fails, over the 0.2 share",
        "calc-passing": f"always passes ({K}/{K})",
    }
    assert curated.read_text() == ""
    # another probe run's id reads none of these probes
    done = otel_rl("tasks", "curate", str(tasks), "--probe-id", "probe-two", *common)
    assert json.loads(done.stdout)["dropped"] == {
        "calc-1": "no probe with a trusted reward",
        "calc-passing": "no probe with a trusted reward",
    }


def test_probe_refuses_bad_input_naming_it(server: ServerProcess, tmp_path: Path) -> None:
    tasks = task_file(tmp_path)
    config = config_file(tmp_path, server)
    done = otel_rl("tasks", "probe", str(tasks), "-c", str(config), "--k", "0")
    assert done.returncode == 1 and "--k 0: between 1 and 64" in done.stderr
    done = otel_rl("tasks", "probe", str(tasks), "-c", str(config), "--probe-id", "bad\nid")
    assert done.returncode == 1 and "unprintable" in done.stderr
    kubernetes = yaml.safe_load(config.read_text())
    kubernetes["controller"]["backend"] = "kubernetes"
    config.write_text(yaml.safe_dump(kubernetes))
    done = otel_rl("tasks", "probe", str(tasks), "-c", str(config))
    assert done.returncode == 1 and "needs a `controller.kubernetes` section" in done.stderr


def test_training_reprobes_its_tasks_on_its_own_runner_every_n_steps(
    server: ServerProcess, tmp_path: Path
) -> None:
    import asyncio

    from otel_rl.train.config import config_from_dict
    from otel_rl.train.controllers import open_runner, train_settings
    from otel_rl.train.reprobe import reprobe, reprobe_due
    from otel_rl.train.server_client import ServerClient
    from otel_rl.train.tasks import Task

    coding = {
        "tasks": str(task_file(tmp_path)),
        "binds": [str(HARNESS.parent)],
        "reprobe_every": 2,
        "probe_k": K,
    }
    config = config_from_dict(
        yaml.safe_load(config_file(tmp_path, server).read_text()) | {"controller": {"coding": coding}}
    )
    assert [step for step in range(1, 7) if reprobe_due(config, step)] == [2, 4, 6]
    tasks = [Task("calc-1", {"id": "calc-1"}), Task("calc-passing", {"id": "calc-passing"})]
    client = ServerClient(server.http_url, server.token)

    async def probe() -> tuple:
        runner = open_runner(config, client, train_settings(config), "run-x")
        try:
            return await reprobe(config, client, runner, tasks[1:], run_id="run-x", step=2)
        finally:
            await runner.aclose()

    kept, chosen = asyncio.run(probe())
    # only the run's own tasks are probed; one that always passes teaches nothing, but with no task left the
    # run keeps training on what it has
    assert chosen.dropped == {"calc-passing": f"always passes ({K}/{K})"} and not chosen.selected
    assert kept == tasks[1:]
    rows = server.run(
        "SELECT task_id, split, outcome_reward FROM rollouts WHERE starts_with(group_id, 'run-x-probe2-')"
    ).to_dicts()
    assert rows == [{"task_id": "calc-passing", "split": "val", "outcome_reward": 1.0}] * K
