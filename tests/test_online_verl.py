"""The online loop on verl's engine (`backend: verl`, on CPU): two online steps of the calculator task, the
run killed after the first and resumed from its checkpoint, with the local backend's assertions on policy
versions and staleness (test_online.py); and `otel-rl demo --backend verl --world-size 2 --quick` completes
with two ranks.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from otel_rl_server import ServerProcess
from test_online import assert_trained_only_on_the_version_before, recorded_versions

from otel_rl import attributes as attr
from otel_rl.demo import QUICK
from otel_rl.query import query
from otel_rl.train.config import load_config
from otel_rl.train.online import run_online
from otel_rl.train.resume import RUN_FILE, STATE_FILE
from otel_rl.train.server_client import ServerClient

ROOT = Path(__file__).resolve().parent.parent
OTEL_RL = Path(sys.executable).parent / "otel-rl"
AGENT = [sys.executable, str(ROOT / "examples" / "calc_agent.py")]


@pytest.fixture(scope="module")
def gateway(vllm_server, tmp_path_factory):
    """`otel-rl serve` with its gateway in front of the session's vLLM server (tiny model)."""
    workdir = tmp_path_factory.mktemp("online_verl")
    server = ServerProcess(workdir / "online.duckdb", workdir, flags=("--vllm", vllm_server.url)).start()
    yield server
    server.stop()


def calc_tasks(path: Path, n: int) -> Path:
    sys.path.insert(0, str(ROOT / "examples"))
    from calc_task import sample_tasks, split_problems, write_tasks

    return write_tasks(path, sample_tasks(split_problems()[0], n, "train", seed=0))


def step_recorded(gateway: ServerProcess, output: Path) -> bool:
    if not (output / "step-1" / STATE_FILE).is_file():
        return False
    run_id = json.loads((output / RUN_FILE).read_text())["run_id"]
    return bool(recorded_versions(gateway, run_id))


def test_an_online_run_on_verl_killed_mid_run_resumes_from_its_checkpoint(gateway, tiny_model_dir, tmp_path):
    output = tmp_path / "run"
    config = tmp_path / "train.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": str(tiny_model_dir),
                "output_dir": str(output),
                "steps": 2,
                "backend": "verl",
                "server": {"url": gateway.http_url, "token": gateway.token},
                "algorithm": {"group_size": 2, "groups_per_step": 2, "max_staleness": 0},
                "reward": {"trusted_sources": ["harness"]},
                "online": {"tasks": str(calc_tasks(tmp_path / "train.jsonl", 8)), "harness": AGENT},
            }
        )
    )
    client = ServerClient(gateway.http_url, gateway.token)
    log_path = tmp_path / "train.log"
    with log_path.open("wb") as log:
        # A session of its own: SIGKILL reaches the loop and its trainer process, and nothing else here.
        train = subprocess.Popen(
            [str(OTEL_RL), "train", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while not step_recorded(gateway, output):  # step 1 saved, the servers reloaded, its span exported
            assert train.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        os.killpg(train.pid, signal.SIGKILL)  # no shutdown code runs: only what step 1 saved survives
        train.wait(30)
        assert not (output / "step-2").exists(), "the kill came too late to test a resume"
        first = json.loads((output / "step-1" / STATE_FILE).read_text())

        resumed = run_online(load_config(config))
    finally:
        if train.poll() is None:
            os.killpg(train.pid, signal.SIGKILL)
        # Other tests expect the session's vLLM server to serve the original weights.
        client.set_policy(tiny_model_dir, client.policy()["version"] + 1)
        client.close()

    assert [s.step for s in resumed.steps] == [2]
    assert resumed.run_id == json.loads((output / RUN_FILE).read_text())["run_id"]
    (step,) = resumed.steps
    assert first["step"] == 1 and not set(step.group_ids) & set(first["consumed"])
    assert step.samples > 0 and step.trainer["mismatch"] < 1e-3  # verl's logprobs are vLLM's (float32)
    # The restart reloads the servers only when they no longer serve step 1's weights at its version.
    assert step.policy_version in (first["version"] + 1, first["version"] + 2)
    assert_trained_only_on_the_version_before(gateway, resumed.steps)
    # Step 1's span was exported before the kill, step 2's by the resumed run.
    assert recorded_versions(gateway, resumed.run_id) == [
        (attr.TRAIN_STEP_SPAN_NAME, first["version"]),
        (attr.TRAIN_STEP_SPAN_NAME, step.policy_version),
    ]
    assert (output / "step-2" / "model.safetensors").is_file()


def test_quick_demo_with_the_verl_backend_at_world_size_2_completes(tmp_path):
    """As a user types it, from the repository root, with a working folder of its own; two verl ranks (world
    size 1 runs in the test above)."""
    workdir = tmp_path / "demo"
    done = subprocess.run(
        [
            *(str(OTEL_RL), "demo", "--quick", "--no-serve", "--backend", "verl", "--world-size", "2"),
            *("--workdir", str(workdir)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "held-out greedy success" in done.stdout
    report = json.loads((workdir / "report.json").read_text())
    assert report["steps"] == QUICK.rl_steps
    assert report["world_size"] == 2 and report["backend"] == "verl"
    assert all(step["trainer"]["mismatch"] < 1e-4 for step in report["train_steps"])
    versions = query(
        "SELECT DISTINCT policy_version FROM llm_calls WHERE split = 'train' ORDER BY 1",
        db=workdir / "otel_rl.duckdb",
    ).rows()
    assert len(versions) >= 2  # the harnesses were served by successive policies verl trained
