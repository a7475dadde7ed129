"""A coding rollout on real parts: the local controller runs a scripted harness in bubblewrap over a HumanEval
workspace, against a real `otel-rl serve` on loopback; the grader outside posts the reward as `grader`."""

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from coding_tasks import humaneval_task_file
from fake_vllm import MODEL, FakeVLLM
from otel_rl_server import ServerProcess
from pydantic import ValidationError
from samples_data import calls_frame, rewards_frame, rollouts_frame
from test_controller import recorded_attempts

from otel_rl import attributes as attr
from otel_rl.coding import humaneval, sandbox
from otel_rl.coding.tasks import load_tasks
from otel_rl.controller import Controller, ControllerSettings, Rollout, RolloutStatus, new_id
from otel_rl.controller.coding import CodingLauncher, agent_task, reward_body
from otel_rl.train.config import TrainConfig
from otel_rl.train.server_client import ServerClient
from otel_rl.transforms.rewards import RewardSpec
from otel_rl.transforms.samples import SampleOptions, exclude_rollouts

HARNESS = Path(__file__).parent / "harnesses" / "sandboxed_coder.py"
OTEL_RL = str(Path(sys.executable).with_name("otel-rl"))
PROBES = {"model": MODEL, "ports": [], "outside": "127.0.0.2", "host_paths": [], "scan": False}
LIMITS = sandbox.Limits(cpu_seconds=60, wall_seconds=60)
CANONICAL = humaneval.read_problems()[0]["canonical_solution"]
WRONG = "    return True\n"


def reply(request: dict, index: int) -> str:
    """The function body: the canonical one when the harness asks for `right`, else a wrong one."""
    return CANONICAL if request["messages"][-1]["content"].startswith(("right", "truncate")) else WRONG


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeVLLM]:
    with FakeVLLM(reply, model=MODEL) as fake:
        yield fake


@pytest.fixture(scope="module")
def server(upstream: FakeVLLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("coding_rollout")
    process = ServerProcess(workdir / "otel_rl.duckdb", workdir, flags=("--vllm", upstream.base_url)).start()
    yield process
    process.stop()


def wait_rows(server: ServerProcess, sql: str, count: int, timeout: float = 30) -> list[dict]:
    """The query's rows once there are `count` (ingest is asynchronous), or the assertion that says which."""
    deadline = time.monotonic() + timeout
    while len(rows := server.sql(sql).to_pylist()) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(rows) == count, rows
    return rows


def controller(server: ServerProcess, launcher: CodingLauncher, probes: dict, log_dir: Path) -> Controller:
    client = ServerClient(server.http_url, server.token)
    settings = ControllerSettings(
        command=[sys.executable, str(HARNESS), json.dumps(probes)], timeout_s=60, max_attempts=1,
        log_dir=log_dir,
    )  # fmt: skip
    return Controller(
        settings, otlp_endpoint=server.http_url, openai_base_url=f"{server.http_url}/v1", token=server.token,
        issue_key=client.issue_rollout_key, revoke_key=client.revoke_rollout_key, launcher=launcher,
    )  # fmt: skip


def test_a_sandboxed_rollout_is_rewarded_by_the_grader_and_sees_only_the_gateway(
    server: ServerProcess, upstream: FakeVLLM, tmp_path: Path
) -> None:
    task_set = load_tasks(humaneval_task_file(tmp_path, count=1))
    task = task_set.tasks[0]
    client = ServerClient(server.http_url, server.token)
    launcher = CodingLauncher(
        task_set, admin_token=server.token, post_reward=client.post_reward, limits=LIMITS,
        grader_limits=LIMITS, binds=[HARNESS.parent], truncated_exit_codes=[75],
    )  # fmt: skip
    probes = {
        "model": MODEL,
        "ports": [upstream.port, server.grpc_port],  # listening on the host's loopback, not forwarded
        "outside": "10.255.255.1",
        "resolve": "pypi.org",
        "host_paths": [str(task_set.path), str(server.db), str(server.workdir)],
    }
    rollouts = {
        # the harness gets the problem statement from the launcher (agent_task), not from the rollout's task
        answer: Rollout(new_id(), new_id(), task.instance_id, {"answer": answer})
        for answer in ("right", "wrong")
    }
    results = controller(server, launcher, probes, tmp_path / "logs").run(list(rollouts.values()))
    assert [result.status for result in results] == [RolloutStatus.OK, RolloutStatus.OK]

    for answer, rollout in rollouts.items():
        [attempt] = recorded_attempts(server, rollout.rollout_id, 1)
        assert attempt["status"] == "ok"
        report = json.loads(results[list(rollouts).index(answer)].attempts[-1].log_path.read_text())
        assert report["cwd"] == sandbox.WORKSPACE and len(report["git_log"]) == 1  # no history to mine
        # caught inside: reset before any byte reaches the host's listener or an outside address
        assert set(report["connects"].values()) == {"ConnectionResetError"}, report["connects"]
        assert report["outside"] == "ConnectionResetError"
        assert report["resolved"] == "gaierror"  # the sandbox's DNS refuses every name
        assert not any(report["host_paths"].values()), report["host_paths"]
        visible = report["visible"]
        assert "OPENAI_API_KEY=orl-rk-" in visible  # the dump reads the environment
        assert server.token not in visible
        assert task.test_patch.strip() not in visible and "def check(candidate)" not in visible
        assert task.patch.strip() not in visible

    rows = wait_rows(
        server,
        "SELECT rollout_id, source, value, label, explanation FROM rewards WHERE name = 'outcome' AND "
        f"rollout_id IN ('{rollouts['right'].rollout_id}', '{rollouts['wrong'].rollout_id}')",
        4,
    )
    by = {(row["rollout_id"], row["source"]): row for row in rows}
    for answer, expected in (("right", 1.0), ("wrong", 0.0)):
        rollout_id = rollouts[answer].rollout_id
        assert by[(rollout_id, "grader")]["value"] == expected
        assert by[(rollout_id, "harness")]["value"] == 1.0  # its own claim, as the harness's
        explanation = json.loads(by[(rollout_id, "grader")]["explanation"])
        assert explanation["tests"] == {humaneval.HIDDEN_TEST_ID: "passed" if expected else "failed"}
        assert (
            server.scalar(f"SELECT outcome_reward FROM rollouts WHERE rollout_id = '{rollout_id}'")
            == expected
        )

    [span] = server.sql(
        "SELECT attributes FROM spans WHERE scope_name = 'otel_rl.controller' AND "
        f"attributes ->> 'otel_rl.rollout.id' = '{rollouts['right'].rollout_id}'"
    ).to_pylist()
    attributes = json.loads(span["attributes"]) if isinstance(span["attributes"], str) else span["attributes"]
    assert attributes[attr.SANDBOX_MODE] == "bubblewrap"
    assert attributes[attr.SANDBOX_LIMITS + "cpu_seconds"] == 60
    assert attributes[attr.GRADE_OUTCOME] == "graded" and attributes[attr.GRADE_REWARD] == 1
    harness_resource = server.sql(
        "SELECT resource_attributes FROM spans WHERE name = 'self_check' AND "
        f"resource_attributes ->> 'otel_rl.rollout.id' = '{rollouts['right'].rollout_id}'"
    ).to_pylist()
    assert len(harness_resource) == 1 and "otel_rl.sandbox.mode" in str(harness_resource[0])

    # the denied attempts, recorded by the sandbox's network on the controller's span, flag both rollouts
    ids = "', '".join(rollout.rollout_id for rollout in rollouts.values())
    evidence = server.sql(
        "SELECT rollout_id, evidence FROM detections WHERE detector = 'network_denied' AND "
        f"rollout_id IN ('{ids}')"
    ).to_pylist()
    for rollout in rollouts.values():
        seen = {row["evidence"] for row in evidence if row["rollout_id"] == rollout.rollout_id}
        expected = {
            f"tcp 127.0.0.1:{upstream.port}",
            f"tcp 127.0.0.1:{server.grpc_port}",
            "tcp 10.255.255.1:80",
        }
        assert expected | {"dns pypi.org"} == seen, seen
        flags = server.sql(
            f"SELECT detectors FROM hack_flags WHERE rollout_id = '{rollout.rollout_id}'"
        ).to_pylist()
        assert flags and "network_denied" in flags[0]["detectors"], flags
    assert attributes[attr.SANDBOX_DENIED_CONNECTS] >= 4


def test_an_episode_cut_by_its_harness_limit_is_truncated_not_graded_and_left_out_of_training(
    server: ServerProcess, tmp_path: Path
) -> None:
    task_set = load_tasks(humaneval_task_file(tmp_path, count=1))
    task = task_set.tasks[0]
    client = ServerClient(server.http_url, server.token)
    launcher = CodingLauncher(
        task_set, admin_token=server.token, post_reward=client.post_reward, limits=LIMITS,
        binds=[HARNESS.parent], truncated_exit_codes=[75],
    )  # fmt: skip
    rollout = Rollout(new_id(), new_id(), task.instance_id, {**agent_task(task), "answer": "truncate"})
    [result] = controller(server, launcher, {"model": MODEL}, tmp_path / "logs").run([rollout])
    assert result.status is RolloutStatus.TRUNCATED and result.attempts[-1].exit_code == 75
    [attempt] = recorded_attempts(server, rollout.rollout_id, 1)
    assert attempt["status"] == "truncated"
    assert (
        server.scalar(f"SELECT status FROM rollouts WHERE rollout_id = '{rollout.rollout_id}'") == "truncated"
    )
    [attributes] = server.sql(
        "SELECT attributes ->> 'otel_rl.rollout.truncated' AS truncated, "
        "attributes ->> 'otel_rl.grade.outcome' AS outcome FROM spans"
        " WHERE scope_name = 'otel_rl.controller' "
        f"AND attributes ->> 'otel_rl.rollout.id' = '{rollout.rollout_id}'"
    ).to_pylist()
    assert attributes == {"truncated": "harness_limit", "outcome": "not_graded"}
    # the right fix it wrote is not graded: no reward at all
    assert server.scalar(f"SELECT count(*) FROM rewards WHERE rollout_id = '{rollout.rollout_id}'") == 0


def test_infrastructure_failures_are_infra_errors_and_never_a_reward(
    server: ServerProcess, tmp_path: Path
) -> None:
    task_set = load_tasks(humaneval_task_file(tmp_path, count=1))
    task = task_set.tasks[0]
    client = ServerClient(server.http_url, server.token)
    cases = {  # a bind whose source is missing: bwrap cannot set up; a grader whose wall clock is too short
        "not_graded": {"binds": [HARNESS.parent, tmp_path / "missing"]},
        "infrastructure_error": {
            "binds": [HARNESS.parent],
            "grader_limits": sandbox.Limits(wall_seconds=0.01),
        },
    }
    for outcome, options in cases.items():
        launcher = CodingLauncher(
            task_set, admin_token=server.token, post_reward=client.post_reward, **options
        )
        rollout = Rollout(new_id(), new_id(), task.instance_id, {"answer": "right"})
        [result] = controller(server, launcher, PROBES, tmp_path / "logs").run([rollout])
        assert result.status is RolloutStatus.INFRA_ERROR
        [row] = wait_rows(
            server,
            "SELECT attributes ->> 'otel_rl.grade.outcome' AS outcome, attributes ->> 'otel_rl.grade.error' "
            "AS error FROM spans WHERE scope_name = 'otel_rl.controller' "
            f"AND attributes ->> 'otel_rl.rollout.id' = '{rollout.rollout_id}'",
            1,
        )
        assert row["outcome"] == outcome and row["error"], row
        sources = server.sql(f"SELECT source FROM rewards WHERE rollout_id = '{rollout.rollout_id}'")
        assert "grader" not in sources.column("source").to_pylist()


def test_an_unsandboxed_rollout_asked_for_by_name_is_graded_and_says_so(
    server: ServerProcess, tmp_path: Path
) -> None:
    task_set = load_tasks(humaneval_task_file(tmp_path, count=1))
    task = task_set.tasks[0]
    client = ServerClient(server.http_url, server.token)
    launcher = CodingLauncher(
        task_set, admin_token=server.token, post_reward=client.post_reward, limits=LIMITS,
        grader_limits=LIMITS, mode="unsandboxed",
    )  # fmt: skip
    rollout = Rollout(new_id(), new_id(), task.instance_id, {"answer": "right"})
    [result] = controller(server, launcher, PROBES, tmp_path / "logs").run([rollout])
    assert result.status is RolloutStatus.OK
    report = json.loads(result.attempts[-1].log_path.read_text())
    assert report["cwd"] != sandbox.WORKSPACE and report["cwd"].endswith("/workspace")
    [row] = wait_rows(
        server,
        f"SELECT value FROM rewards WHERE rollout_id = '{rollout.rollout_id}' AND source = 'grader'",
        1,
    )
    assert row["value"] == 1.0
    modes = server.sql(
        "SELECT scope_name, coalesce(attributes ->> 'otel_rl.sandbox.mode', resource_attributes ->> "
        "'otel_rl.sandbox.mode') AS mode FROM spans "
        "WHERE scope_name IN ('otel_rl.controller', 'sandboxed_coder') "
        f"AND (attributes ->> 'otel_rl.rollout.id' = '{rollout.rollout_id}' OR "
        f"resource_attributes ->> 'otel_rl.rollout.id' = '{rollout.rollout_id}') ORDER BY scope_name"
    ).to_pylist()
    assert modes == [
        {"scope_name": "otel_rl.controller", "mode": "unsandboxed"},
        {"scope_name": "sandboxed_coder", "mode": "unsandboxed"},
    ]


def test_the_wall_clock_ends_the_whole_sandbox_and_the_episode_is_truncated(
    server: ServerProcess, tmp_path: Path
) -> None:
    task_set = load_tasks(humaneval_task_file(tmp_path, count=1))
    task = task_set.tasks[0]
    limits = sandbox.Limits(cpu_seconds=60, wall_seconds=3)
    launcher = CodingLauncher(
        task_set,
        admin_token=server.token,
        post_reward=lambda body: None,
        limits=limits,
        binds=[HARNESS.parent],
    )
    rollout = Rollout(new_id(), new_id(), task.instance_id, {"answer": "hang"})
    [result] = controller(server, launcher, PROBES, tmp_path / "logs").run([rollout])
    assert result.status is RolloutStatus.TIMEOUT and result.attempts[-1].duration_s < 30
    [row] = wait_rows(
        server,
        "SELECT attributes ->> 'otel_rl.rollout.truncated' AS truncated FROM spans WHERE scope_name = "
        f"'otel_rl.controller' AND attributes ->> 'otel_rl.rollout.id' = '{rollout.rollout_id}'",
        1,
    )
    assert row == {"truncated": "time"}
    left = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if rollout.rollout_id.encode() in environ.read_bytes():
                left.append(environ.parent.name)
    assert not left, f"processes of the rollout still running: {left}"


def test_samples_leave_truncated_rollouts_out_even_with_a_reward_or_a_fill_value() -> None:
    rollouts = rollouts_frame(("cut", "g", "truncated"), ("done", "g", "ok"))
    rewards = rewards_frame(("cut", 0.0), ("done", 1.0))
    for options in (SampleOptions(), SampleOptions(reward=RewardSpec(missing=0.0))):
        kept, dropped, _ = exclude_rollouts(rollouts, calls_frame(), rewards, options)
        assert kept["rollout_id"].to_list() == ["done"] and dropped == {"truncated": 1}


def test_rollouts_run_with_a_coding_section_sandboxes_and_grades(
    server: ServerProcess, tmp_path: Path
) -> None:
    tasks = humaneval_task_file(tmp_path, count=1)
    (tmp_path / "train.jsonl").write_text(json.dumps({"id": "HumanEval__0", "answer": "right"}) + "\n")
    config = {
        "model": str(tmp_path / "model"),
        "output_dir": str(tmp_path / "out"),
        "server": {"url": server.http_url, "token": server.token},
        "online": {"harness": [sys.executable, str(HARNESS), json.dumps(PROBES)], "timeout_s": 60},
        "controller": {"coding": {"tasks": str(tasks), "binds": [str(HARNESS.parent)], "cpu_seconds": 60}},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [OTEL_RL, "rollouts", "run", str(tmp_path / "train.jsonl"), "-c", str(tmp_path / "config.yaml")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [line] = [json.loads(text) for text in done.stdout.splitlines()]
    assert line["status"] == "ok"
    sql = f"SELECT source, value FROM rewards WHERE rollout_id = '{line['rollout_id']}' ORDER BY source"
    rows = wait_rows(server, sql, 2)
    assert rows == [{"source": "grader", "value": 1.0}, {"source": "harness", "value": 1.0}]
    # where the sandbox cannot start, nothing runs: the probe's error says what is missing
    no_bwrap = {**os.environ, "PATH": str(tmp_path / "no-such-bin")}
    done = subprocess.run(
        [OTEL_RL, "rollouts", "run", str(tmp_path / "train.jsonl"), "-c", str(tmp_path / "config.yaml")],
        capture_output=True, text=True, timeout=120, env=no_bwrap,
    )  # fmt: skip
    assert done.returncode == 1 and "bwrap is not installed" in done.stderr and not done.stdout
    config["controller"] = {"backend": "kubernetes", "coding": config["controller"]["coding"]}
    with pytest.raises(ValidationError, match="needs a `controller.kubernetes` section"):
        TrainConfig.model_validate(config)


def test_the_launcher_refuses_to_hand_the_harness_a_secret(server: ServerProcess, tmp_path: Path) -> None:
    task_set = load_tasks(humaneval_task_file(tmp_path, count=1))
    task = task_set.tasks[0]
    launcher = CodingLauncher(task_set, admin_token=server.token, post_reward=lambda body: None)
    leaky = [
        Rollout(
            new_id(), new_id(), task.instance_id, {**agent_task(task), "answer": "right", "patch": task.patch}
        ),
        Rollout(new_id(), new_id(), task.instance_id, {**agent_task(task), "answer": server.token}),
    ]
    results = controller(server, launcher, {"model": MODEL}, tmp_path / "logs").run(leaky)
    assert [result.status for result in results] == [RolloutStatus.INFRA_ERROR] * 2
    logs = [result.attempts[-1].log_path.read_text() for result in results]
    assert "grader-side fields" in logs[0] and "would be handed the admin token" in logs[1]
    with pytest.raises(ValueError, match="would show"):
        CodingLauncher(task_set, admin_token="x", post_reward=lambda body: None, binds=[tmp_path])


def test_the_reward_body_names_the_grader_and_carries_the_tests() -> None:
    from otel_rl.coding.grader import GradeResult

    result = GradeResult(
        instance_id="t", outcome="graded", reward=0, tests={"a::b": "failed"}, dropped_paths=["conftest.py"],
        seconds=1.0,
    )  # fmt: skip
    rollout = Rollout("r" * 32, "g", "t", {})
    body = reward_body(rollout, result)
    assert body["source"] == "grader" and body["value"] == 0.0 and body["label"] == "fail"
    assert json.loads(body["explanation"]) == {"tests": {"a::b": "failed"}, "dropped_paths": ["conftest.py"]}
