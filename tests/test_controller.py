"""The local rollout controller: statuses, the environment contract, process-group kills and retries."""

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opentelemetry.trace import SpanContext, TraceFlags

from otel_rl import attributes as attr
from otel_rl.controller import Controller, ControllerSettings, Rollout, RolloutStatus, new_id
from otel_rl.controller.environment import CONTRACT_VARS, harness_argv, harness_environment
from otel_rl.controller.forkserver import ForkServer, python_target
from otel_rl.controller.local import classify
from otel_rl.train.server_client import ServerClient

PROBE = str(Path(__file__).parent / "harnesses" / "probe.py")


def probe_rollout(behaviour: str, out: Path) -> Rollout:
    (out / behaviour).mkdir(parents=True)
    task = {"behaviour": behaviour, "out": str(out / behaviour)}
    return Rollout(new_id(), new_id(), f"probe-{behaviour}", task)


def controller_for(server, settings: ControllerSettings) -> Controller:
    client = ServerClient(server.http_url, server.token)
    return Controller(
        settings,
        otlp_endpoint=server.http_url,
        openai_base_url=f"{server.http_url}/v1",
        token=server.token,
        issue_key=client.issue_rollout_key,
        revoke_key=client.revoke_rollout_key,
    )


def recorded_attempts(server, rollout_id: str, expected: int, timeout: float = 30) -> list[dict]:
    """The controller's `otel_rl.rollout` spans of a rollout (one per attempt, in order), once all arrived."""
    deadline = time.monotonic() + timeout
    while True:
        rows = server.sql(
            "SELECT attributes ->> 'otel_rl.attempt.id' AS attempt_id, "
            "attributes ->> 'otel_rl.rollout.status' AS status, "
            "CAST(attributes ->> 'otel_rl.rollout.exit_code' AS INTEGER) AS exit_code FROM spans "
            "WHERE scope_name = 'otel_rl.controller' AND name = 'otel_rl.rollout' "
            f"AND attributes ->> 'otel_rl.rollout.id' = '{rollout_id}' ORDER BY start_time_unix_nano"
        ).to_pylist()
        if len(rows) >= expected:
            return rows
        assert time.monotonic() < deadline, f"rollout {rollout_id}: {rows}"
        time.sleep(0.2)


def rollouts_view_row(server, rollout_id: str) -> dict:
    [row] = server.sql(
        f"SELECT attempt_id, status, exit_code FROM rollouts WHERE rollout_id = '{rollout_id}'"
    ).to_pylist()
    return row


def is_gone(pid: int) -> bool:
    """Exited (a zombie waiting for its reaper counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def running_children(parent: int) -> list[int]:
    """The processes whose parent is `parent` and that have not exited (zombies count as exited)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except OSError:  # it exited while we looked
            continue
        if int(ppid) == parent and state != "Z":
            found.append(int(stat.parent.name))
    return found


@pytest.fixture(scope="module", params=["exec", "forked"])
def probe_run(request, otel_rl_server, tmp_path_factory, monkeypatch_module):
    """One controller run of every behaviour at once (they run concurrently), as the tests' shared scene:
    each harness a fresh interpreter, or forked from a fork server that preloaded the OTel SDK."""
    out = tmp_path_factory.mktemp("probe")
    # What an operator's shell might hold: none of it may reach a harness.
    monkeypatch_module.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch_module.setenv("OPENAI_API_KEY", "sk-the-operators-real-key")
    monkeypatch_module.setenv("PROBE_INHERITED", "kept")
    settings = ControllerSettings(
        command=[sys.executable, PROBE, "{task}"],
        concurrency=8,
        timeout_s=6,
        kill_grace_s=0.5,
        max_attempts=2,
        log_dir=out / "logs",
        env={"OTEL_SERVICE_NAME": "probe-harness"},
        preload=("otel_rl", "opentelemetry.sdk.trace") if request.param == "forked" else (),
        nice=3,
    )
    rollouts = {b: probe_rollout(b, out) for b in ("ok", "fail", "crash", "hang", "crash_once")}
    controller = controller_for(otel_rl_server, settings)
    results = controller.run(list(rollouts.values()))
    controller.close()
    return out, rollouts, {result.rollout.task_id.removeprefix("probe-"): result for result in results}


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.mark.parametrize(
    ("behaviour", "statuses", "exit_codes"),
    [
        ("ok", ["ok"], [0]),
        ("fail", ["error"], [3]),
        ("crash", ["crashed", "crashed"], [-6, -6]),
        ("hang", ["timeout", "timeout"], [-9, -9]),
        ("crash_once", ["crashed", "ok"], [-6, 0]),
    ],
)
def test_each_ending_is_recorded_as_the_rollouts_status(
    otel_rl_server, probe_run, behaviour, statuses, exit_codes
):
    _, rollouts, results = probe_run
    result = results[behaviour]
    assert [a.status.value for a in result.attempts] == statuses
    assert [a.exit_code for a in result.attempts] == exit_codes
    rollout_id = rollouts[behaviour].rollout_id
    attempts = recorded_attempts(otel_rl_server, rollout_id, len(statuses))
    assert attempts == [
        {"attempt_id": a.attempt_id, "status": a.status.value, "exit_code": a.exit_code}
        for a in result.attempts
    ]
    # The rollouts view shows each rollout's final attempt.
    assert rollouts_view_row(otel_rl_server, rollout_id) == attempts[-1]


def test_infrastructure_failures_are_retried_as_new_attempts_and_harness_errors_are_not(probe_run):
    _, _, results = probe_run
    retried = results["crash_once"]
    assert len({a.attempt_id for a in retried.attempts}) == 2
    assert len({a.trace_id for a in retried.attempts}) == 2
    assert retried.status is RolloutStatus.OK
    assert len(results["fail"].attempts) == 1  # a non-zero exit is the harness's verdict: not retried
    assert len(results["crash"].attempts) == 2  # bounded by max_attempts


def test_a_timeout_kills_the_whole_process_group(probe_run):
    out, _, results = probe_run
    # The attempt's time includes issuing its key and starting the harness, seconds on a loaded 2-core
    # machine (9.8-22 s seen beside other jobs): far below the 600 s the harness would sleep shows the kill.
    assert 6 <= results["hang"].attempts[0].duration_s < 6 + 0.5 + 30
    pids = [int(path.read_text()) for path in (out / "hang").glob("grandchild-*.pid")]
    assert len(pids) == 2
    deadline = time.monotonic() + 5
    while not all(is_gone(pid) for pid in pids):
        assert time.monotonic() < deadline, f"grandchildren {pids} outlived their rollout"
        time.sleep(0.1)


def test_the_harness_receives_exactly_the_documented_environment(otel_rl_server, probe_run):
    out, rollouts, results = probe_run
    rollout, result = rollouts["ok"], results["ok"]
    env = json.loads((out / "ok" / "env-0.json").read_text())
    attempt = result.attempts[0]
    key = env["OPENAI_API_KEY"]
    trace_id = attempt.trace_id
    expected = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otel_rl_server.http_url,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer%20{key}",
        "OTEL_RESOURCE_ATTRIBUTES": (
            f"otel_rl.rollout.id={rollout.rollout_id},otel_rl.attempt.id={attempt.attempt_id},"
            f"otel_rl.group.id={rollout.group_id},otel_rl.task.id=probe-ok,otel_rl.split=train"
        ),
        "OPENAI_BASE_URL": f"{otel_rl_server.http_url}/v1",
        "OPENAI_API_KEY": key,
        "OTEL_RL_TASK": json.dumps(rollout.task, separators=(",", ":"), sort_keys=True),
        "OTEL_SERVICE_NAME": "probe-harness",  # from the `env` setting
    }
    ours = {k: v for k, v in env.items() if k.startswith(("OTEL_", "OPENAI_", "TRACE"))}
    assert set(ours) == set(CONTRACT_VARS) | {"OTEL_SERVICE_NAME"}
    assert {k: v for k, v in ours.items() if k != "TRACEPARENT"} == expected
    assert env["TRACEPARENT"].startswith(f"00-{trace_id}-")
    assert env["PROBE_INHERITED"] == "kept" and env["PATH"] == os.environ["PATH"]
    assert int((out / "ok" / "niceness-0").read_text()) == os.nice(0) + 3  # the `nice` setting
    assert key != otel_rl_server.token
    # The task also reached the command line, and the log file holds the harness's output.
    assert json.dumps([expected["OTEL_RL_TASK"]]) in attempt.log_path.read_text()


def test_a_harness_configured_only_by_the_environment_lands_in_its_rollout(otel_rl_server, probe_run):
    _, rollouts, results = probe_run
    rollout, attempt = rollouts["ok"], results["ok"].attempts[0]
    rows = otel_rl_server.sql(
        "SELECT s.name, s.parent_span_id, p.name AS parent_name, i.rollout_id, i.attempt_id, i.group_id, "
        "s.resource_attributes ->> 'service.name' AS service FROM spans s "
        "JOIN span_identity i USING (trace_id, span_id) LEFT JOIN spans p "
        "ON p.trace_id = s.trace_id AND p.span_id = s.parent_span_id "
        f"WHERE s.trace_id = '{attempt.trace_id}' AND s.name = 'probe.work'"
    ).to_pylist()
    assert rows == [
        {
            "name": "probe.work",
            "parent_span_id": rows[0]["parent_span_id"],
            "parent_name": attr.ROLLOUT_SPAN_NAME,
            "rollout_id": rollout.rollout_id,
            "attempt_id": attempt.attempt_id,
            "group_id": rollout.group_id,
            "service": "probe-harness",
        }
    ]


@pytest.mark.parametrize("nice", [0, 3])  # with nice, the harness is exec'd by nice(1)
def test_a_command_that_cannot_start_is_an_infra_error_and_retried(otel_rl_server, tmp_path, nice):
    settings = ControllerSettings(
        command=[str(tmp_path / "no-such-harness")], max_attempts=2, log_dir=tmp_path, nice=nice
    )
    controller = controller_for(otel_rl_server, settings)
    [result] = controller.run([Rollout(new_id(), new_id(), "t", {})])
    controller.close()
    assert [a.status for a in result.attempts] == [RolloutStatus.INFRA_ERROR] * 2
    assert "FileNotFoundError" in result.attempts[0].log_path.read_text()
    attempts = recorded_attempts(otel_rl_server, result.rollout.rollout_id, 2)
    assert [(a["status"], a["exit_code"]) for a in attempts] == [("infra_error", None)] * 2


def test_a_shell_command_gets_the_task_quoted_and_its_signal_deaths_count_as_crashes():
    task = {"q": "it's 1 + 1", "n": 2}
    [shell, flag, line] = harness_argv("python agent.py --task {task} | tee out", task)
    assert (shell, flag) == ("/bin/sh", "-c")
    assert line == """python agent.py --task '{"n":2,"q":"it'"'"'s 1 + 1"}' | tee out"""
    assert harness_argv(["agent", "--task={task}"], task) == ["agent", '--task={"n":2,"q":"it\'s 1 + 1"}']
    assert classify(128 + 9, timed_out=False, through_shell=True) is RolloutStatus.CRASHED
    assert classify(128 + 9, timed_out=False, through_shell=False) is RolloutStatus.ERROR
    assert classify(-11, timed_out=False, through_shell=False) is RolloutStatus.CRASHED
    assert classify(-9, timed_out=True, through_shell=False) is RolloutStatus.TIMEOUT


def test_settings_may_not_overwrite_a_contract_variable():
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        ControllerSettings(command=["agent"], env={"OPENAI_API_KEY": "x"})


def test_preload_accepts_only_python_harness_commands():
    assert python_target(["python3", "agent.py", "--x"]) == ("path", "agent.py", ["--x"])
    assert python_target([sys.executable, "-m", "pkg.agent", "1"]) == ("module", "pkg.agent", ["1"])
    for command in (["node", "agent.js"], ["python"], ["python", "-m"], ["python", "-u", "agent.py"]):
        with pytest.raises(ValueError, match="python"):
            ControllerSettings(command=command, preload=("openai",))
    with pytest.raises(ValueError, match="argv list"):
        ControllerSettings(command="python agent.py", preload=("openai",))


def test_preloading_openai_builds_the_response_models_a_harness_parses_before_it_forks():
    """openai builds its response models' validators on first use; a fork server builds them once."""
    check = (
        "from openai.types.chat import ChatCompletion, ChatCompletionMessage\n"
        "from openai.types.chat.chat_completion import Choice\n"
        "models = (ChatCompletion, Choice, ChatCompletionMessage)\n"
        "before = [m.__pydantic_complete__ for m in models]\n"
        "from otel_rl.controller.forkserver import preload\n"
        "preload(['openai'])\n"
        "print(before, [m.__pydantic_complete__ for m in models])\n"
    )
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["[False,", "False,", "False]", "[True,", "True,", "True]"]


def test_an_attempt_cancelled_while_its_child_is_forked_leaves_no_process_and_the_server_goes_on(tmp_path):
    """A step ending or Ctrl-C cancels attempts at any moment, also between the fork request and the fork
    server's answer: that child is killed when the answer comes, and the server keeps serving."""
    survived = tmp_path / "survived"
    slow = tmp_path / "slow.py"  # a harness that would leave a mark a second in, were it left running
    slow.write_text(f"import pathlib, time\ntime.sleep(1)\npathlib.Path({str(survived)!r}).write_text('')\n")
    quick = tmp_path / "quick.py"
    quick.write_text("")

    async def scene() -> int:
        server = ForkServer(sys.executable, [], dict(os.environ), tmp_path / "forkserver.log")
        try:
            await (await server.spawn([sys.executable, str(quick)], {}, tmp_path / "0.log", 0)).wait()
            cancelled_in_flight = 0
            for i in range(5):
                spawn = server.spawn([sys.executable, str(slow)], {}, tmp_path / f"{i}.log", 0)
                attempt = asyncio.create_task(spawn)
                for _ in range(i):  # cancel at a different point each time: before, during, after the fork
                    await asyncio.sleep(0)
                attempt.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    forked = await attempt
                    os.killpg(forked.pid, signal.SIGKILL)  # answered before the cancel: the controller's kill
                cancelled_in_flight += attempt.cancelled()
            assert cancelled_in_flight
            last = await server.spawn([sys.executable, str(quick)], {}, tmp_path / "last.log", 0)
            exit_code = await last.wait()
            # Every child the fork server forked has ended (it reaps them): none of the cancelled ones runs.
            [fork_server] = [
                pid
                for pid in running_children(os.getpid())
                if b"forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
            ]
            deadline = time.monotonic() + 10
            while left := running_children(fork_server):
                assert time.monotonic() < deadline, (
                    f"forked children {left} outlived their cancelled attempts"
                )
                await asyncio.sleep(0.05)
            return exit_code
        finally:
            await server.stop()

    assert asyncio.run(asyncio.wait_for(scene(), 30)) == 0
    assert not survived.exists(), "a cancelled attempt's child ran on after its cancel"


def test_a_forked_harness_failing_before_it_runs_is_an_infra_error(otel_rl_server, tmp_path):
    """The fork server cannot start (a module to preload does not exist): every attempt is an infra
    error, retried, and the reason is in the fork server's log."""
    settings = ControllerSettings(
        command=[sys.executable, PROBE], preload=("no_such_module",), max_attempts=2, log_dir=tmp_path
    )
    controller = controller_for(otel_rl_server, settings)
    [result] = controller.run([probe_rollout("ok", tmp_path)])
    controller.close()
    assert [a.status for a in result.attempts] == [RolloutStatus.INFRA_ERROR] * 2
    assert "fork server did not start" in result.attempts[0].log_path.read_text()
    assert "No module named 'no_such_module'" in (tmp_path / "forkserver.log").read_text()


def test_identity_values_are_percent_encoded_in_resource_attributes():
    parent = SpanContext(0xAB, 0xCD, is_remote=False, trace_flags=TraceFlags(1))
    identity = {attr.ROLLOUT_ID: "r1", attr.TASK_ID: "a,b=c d"}
    env = harness_environment(
        inherited={},
        user_env={},
        otlp_endpoint="http://x",
        openai_base_url="http://x/v1",
        api_key="k/+",
        identity=identity,
        parent=parent,
        task={},
    )
    assert env["OTEL_RESOURCE_ATTRIBUTES"] == "otel_rl.rollout.id=r1,otel_rl.task.id=a%2Cb%3Dc%20d"
    assert env["OTEL_EXPORTER_OTLP_HEADERS"] == "authorization=Bearer%20k%2F%2B"
    assert env["TRACEPARENT"] == f"00-{0xAB:032x}-{0xCD:016x}-01"


def test_a_cancelled_rollout_is_recorded_as_infra_error_and_its_processes_die(otel_rl_server, tmp_path):
    controller = controller_for(
        otel_rl_server, ControllerSettings(command=[sys.executable, PROBE], log_dir=tmp_path)
    )
    rollout = probe_rollout("hang", tmp_path)

    async def cancel_once_running() -> None:
        running = asyncio.create_task(controller.run_rollout(rollout))
        while not list((tmp_path / "hang").glob("grandchild-*.pid")):
            await asyncio.sleep(0.1)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running

    asyncio.run(cancel_once_running())
    controller.close()
    [pid_file] = (tmp_path / "hang").glob("grandchild-*.pid")
    deadline = time.monotonic() + 5
    while not is_gone(int(pid_file.read_text())):
        assert time.monotonic() < deadline, "the cancelled rollout's grandchild is still running"
        time.sleep(0.1)
    [attempt] = recorded_attempts(otel_rl_server, rollout.rollout_id, 1)
    assert (attempt["status"], attempt["exit_code"]) == ("infra_error", None)
