"""Coding-agent CLIs as harnesses: each CLI, installed from npm (pinned, cached outside the checkout), runs
the fix-mean task (examples/coding/fix-mean) as a rollout of the real controller through the real
`otel-rl serve` gateway, in front of a vLLM-style upstream scripted to answer with a shell tool call (the
fix), then a final answer. Its rollout shows the calls, the tool call, the check's reward, the CLI's own
telemetry and samples with the exact token ids the upstream returned; Codex and Claude Code also run on real
vLLM with the tiny model, and in the coding sandbox on a mini-smith task, graded outside it."""

import json
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import polars as pl
import pytest
from captures.cli_upstreams import CodingScript
from coding_tasks import calc_task_file, minismith_task_file
from fake_vllm import FakeVLLM, render_chat, tokenize
from otel_rl_server import ServerProcess
from typer.testing import CliRunner

from otel_rl.cli import app
from otel_rl.coding import sandbox
from otel_rl.coding.tasks import load_tasks
from otel_rl.controller import Controller, ControllerSettings, Rollout, RolloutStatus, new_id
from otel_rl.controller.coding import CodingLauncher
from otel_rl.gateway.vllm import VLLMServer
from otel_rl.gateway.vllm_env import cache_root
from otel_rl.harnesses import CLIS
from otel_rl.harnesses.install import install, install_dir
from otel_rl.harnesses.recipe import CodingTask, HarnessError
from otel_rl.harnesses.run import EXPLANATION_CHARS, run_check, run_cli
from otel_rl.tinymodel import TinyModelShape, init_model
from otel_rl.train.server_client import ServerClient

ROOT = Path(__file__).resolve().parent.parent
TASK = json.loads((ROOT / "examples" / "coding" / "fix-mean" / "task.json").read_text())
OTEL_RL = Path(sys.executable).parent / "otel-rl"
MODEL = "fake-model"
# The CLI's service.name on its own telemetry (OTEL_SERVICE_NAME is not set: each CLI names itself).
SERVICE_NAMES = {"codex": "codex_exec", "claude-code": "claude-code", "qwen-code": "qwen-code",
                 "opencode": "opencode"}  # fmt: skip
# The span each CLI writes for its own model calls (Qwen Code's `qwen-code.llm_request` is not one: views.md).
OWN_CALL_SPANS = {"codex": "model_client.stream_responses_api", "claude-code": "claude_code.llm_request",
                  "opencode": "ai.streamText.doStream"}  # fmt: skip


@pytest.fixture(scope="module")
def script() -> CodingScript:
    return CodingScript()


@pytest.fixture(scope="module")
def upstream(script: CodingScript) -> Iterator[FakeVLLM]:
    with FakeVLLM(script.chat_reply, model=MODEL) as fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(upstream: FakeVLLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`otel-rl serve --vllm <scripted upstream>`: collector, store and gateway in one real process."""
    workdir = tmp_path_factory.mktemp("cli_harnesses")
    server = ServerProcess(workdir / "otel_rl.duckdb", workdir, flags=("--vllm", upstream.base_url)).start()
    yield server
    server.stop()


def run_rollout(server: ServerProcess, cli_name: str, log_dir: Path, *, on_garbage: bool = False) -> Rollout:
    """One rollout of `otel-rl harness <cli>` under the real controller; fails with the harness's log.

    `on_garbage`: the model writes garbage, so the check fails, and a CLI may give up on answers cut at the
    gateway's cap (Claude Code exits 1 on a `max_tokens` stop): the rollout is `ok` or `error`."""
    client = ServerClient(server.http_url, server.token)
    settings = ControllerSettings(
        command=[str(OTEL_RL), "harness", cli_name], timeout_s=240, max_attempts=1, log_dir=log_dir
    )
    controller = Controller(
        settings,
        otlp_endpoint=server.http_url,
        openai_base_url=f"{server.http_url}/v1",
        token=server.token,
        issue_key=client.issue_rollout_key,
    )
    rollout = Rollout(new_id(), new_id(), TASK["id"], TASK)
    try:
        [result] = controller.run([rollout])
    finally:
        controller.close()
    log = result.attempts[-1].log_path.read_text(errors="replace")
    allowed = {RolloutStatus.OK, RolloutStatus.ERROR} if on_garbage else {RolloutStatus.OK}
    assert result.status in allowed, log[-5000:]
    assert ("check failed" if on_garbage else "check passed") in log, log[-5000:]
    return rollout


def rows(server: ServerProcess, sql: str) -> list[dict]:
    return server.sql(sql).to_pylist()


def wait_for(server: ServerProcess, sql: str, count: int, timeout: float = 30) -> list[dict]:
    """The query's rows once there are at least `count` (the CLIs' exporters flush at exit, async)."""
    deadline = time.monotonic() + timeout
    while len(found := rows(server, sql)) < count:
        assert time.monotonic() < deadline, f"{sql}: {found}"
        time.sleep(0.3)
    return found


@pytest.mark.parametrize("cli_name", list(CLIS))
def test_a_cli_rollout_lands_with_its_calls_tool_call_reward_telemetry_and_exact_samples(
    gateway, upstream, script, cli_name, tmp_path
):
    cli = CLIS[cli_name]
    install(cli)  # cached under ~/.cache/otel-rl/npm/: a no-op after the first run
    answered, requested = len(script.answers), len(upstream.requests)
    rollout = run_rollout(gateway, cli_name, tmp_path / "logs")
    answers = script.answers[answered:]
    chat_requests = [r.body for r in upstream.requests[requested:] if r.path == "/v1/chat/completions"]
    rid = rollout.rollout_id

    # Every model call went through the gateway, attributed to the rollout by its key, with exact ids.
    calls = wait_for(
        gateway,
        "SELECT prompt_token_ids, completion_token_ids FROM llm_calls "
        f"WHERE rollout_id = '{rid}' AND prompt_token_ids IS NOT NULL ORDER BY start_time_unix_nano",
        len(answers),
    )
    assert len(calls) == len(answers) == len(chat_requests)
    assert [c["prompt_token_ids"] for c in calls] == [
        tokenize(render_chat(b["messages"])) for b in chat_requests
    ]
    [tool_answer] = [a for a in answers if a.tool_call]
    assert not tool_answer.saw_tool_result and any(a.saw_tool_result for a in answers)

    # The shell tool call, with its arguments, in tool_calls.
    tools = wait_for(gateway, f"SELECT name, arguments, result FROM tool_calls WHERE rollout_id = '{rid}'", 1)
    assert tool_answer.tool_call["name"] in {t["name"] for t in tools}
    assert any("len(values)" in (t["arguments"] or "") for t in tools), tools

    # The check's result is the reward, from the harness.
    [reward] = wait_for(gateway, f"SELECT value, source FROM rewards WHERE rollout_id = '{rid}'", 1)
    assert (reward["value"], reward["source"]) == (1.0, "harness")

    # The CLI's own telemetry carries the rollout identity from OTEL_RESOURCE_ATTRIBUTES.
    service = SERVICE_NAMES[cli_name]
    native = wait_for(
        gateway,
        f"SELECT count(*) AS n FROM logs WHERE resource_attributes ->> 'otel_rl.rollout.id' = '{rid}' "
        f"AND resource_attributes ->> 'service.name' = '{service}' HAVING count(*) > 0",
        1,
    )
    assert native[0]["n"] > 0

    # Each call is one row, the gateway's with its exact ids: the CLI's own span of the call (which Codex's
    # forwarded trace context puts three levels above the gateway's) counts as that gateway call.
    if cli_name in OWN_CALL_SPANS:
        # The CLI exports its spans at exit, after the rollout ended, and may drop its last one (opencode
        # did once in a clean-clone run): every one that lands is folded into its gateway call.
        own_sql = (
            f"SELECT gateway_call FROM llm_call_index WHERE rollout_id = '{rid}' "
            f"AND name = '{OWN_CALL_SPANS[cli_name]}'"
        )
        wait_for(gateway, own_sql, 1)
        own = rows(gateway, own_sql)
        assert 1 <= len(own) <= len(answers) and all(s["gateway_call"] is not None for s in own), own
    every = rows(gateway, f"SELECT prompt_token_ids FROM llm_calls WHERE rollout_id = '{rid}'")
    assert len(every) == len(answers) and all(c["prompt_token_ids"] for c in every)

    # Samples use the gateway's exact ids: the first prompt as the upstream tokenized it, the completions.
    out = tmp_path / "samples.parquet"
    exported = CliRunner().invoke(
        app,
        ["export", "samples", "-o", str(out), "--server", gateway.http_url, "--token", gateway.token,
         "--where", f"rollout_id = '{rid}'", "--trusted-source", "harness"],
    )  # fmt: skip
    assert exported.exit_code == 0, exported.output
    samples = pl.read_parquet(out).to_dicts()
    assert samples and all(s["token_source"] == "exact" and s["reward"] == 1.0 for s in samples)
    # The fake's ids are the bytes of the text it generated: the call that asked for the fix is the one
    # whose completion holds it (opencode's title call comes first).
    [fix] = [c for c in calls if b"(len(values) + 1)" in bytes(c["completion_token_ids"][0])]
    sample = next(s for s in samples if s["prompt_ids"] == fix["prompt_token_ids"])
    completion = fix["completion_token_ids"][0]
    assert sample["response_ids"][: len(completion)] == completion


def test_a_coding_task_is_refused_with_the_field_that_is_wrong(tmp_path):
    with pytest.raises(HarnessError, match="task.prompt"):
        CodingTask.from_task({"repo": str(tmp_path), "check": __file__})
    with pytest.raises(HarnessError, match="task.repo"):
        CodingTask.from_task({"prompt": "fix it", "repo": str(tmp_path / "absent"), "check": __file__})
    with pytest.raises(HarnessError, match="task.timeout_s"):
        CodingTask.from_task({"prompt": "x", "repo": str(tmp_path), "check": __file__, "timeout_s": 10**6})


# --- against real vLLM on the tiny model ------------------------------------------------------------------

# A coding CLI's first request is 40-55K characters (system prompt and tool schemas): far past the 512-token
# window of the session's `vllm_server`. The same tiny model, built with room for such prompts, is served
# with a long window; the gateway caps each answer, since the tiny model writes garbage until it is stopped.
LONG_CONTEXT = 65536
ANSWER_CAP = {"train": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 16,
                        "max_completion_tokens": 16}}  # fmt: skip


@pytest.fixture(scope="module")
def long_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    folder = tmp_path_factory.mktemp("tiny_long")
    model = init_model(folder / "tiny", shape=TinyModelShape(max_positions=LONG_CONTEXT))
    log_path = folder / "vllm.log"
    with VLLMServer(model, served_model_name="tiny", log_path=log_path, max_model_len=LONG_CONTEXT) as server:
        yield server


@pytest.fixture(scope="module")
def vllm_gateway(long_vllm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("cli_harnesses_vllm")
    flags = ("--vllm", long_vllm.url, "--split-sampling", json.dumps(ANSWER_CAP))
    server = ServerProcess(workdir / "otel_rl.duckdb", workdir, flags=flags).start()
    yield server
    server.stop()


def vllm_logprobs(server: VLLMServer, prompt: list[int], completion: list[int]) -> list[float]:
    """The model's own logprobs of `completion` after `prompt` (vLLM's prompt logprobs over both)."""
    body = {"model": "tiny", "prompt": prompt + completion, "max_tokens": 1, "prompt_logprobs": 0}
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    scored = response.json()["choices"][0]["prompt_logprobs"][len(prompt) :]
    return [entry[str(token)]["logprob"] for entry, token in zip(scored, completion, strict=True)]


@pytest.mark.parametrize("cli_name", ["codex", "claude-code"])
def test_a_cli_rollout_on_real_vllm_records_the_ids_vllm_sampled(vllm_gateway, long_vllm, cli_name, tmp_path):
    install(CLIS[cli_name])
    rollout = run_rollout(vllm_gateway, cli_name, tmp_path / "logs", on_garbage=True)
    rid = rollout.rollout_id
    calls = wait_for(
        vllm_gateway,
        "SELECT prompt_token_ids, completion_token_ids, completion_logprobs FROM llm_calls "
        f"WHERE rollout_id = '{rid}' AND prompt_token_ids IS NOT NULL ORDER BY start_time_unix_nano",
        1,
    )
    for call in calls:
        assert len(call["prompt_token_ids"]) > 5000 and 0 < len(call["completion_token_ids"][0]) <= 16
    # Ids vLLM sampled have, under the model, the logprobs vLLM reported while sampling them. One call is
    # scored: a scoring pass over a CLI's 30K-token prompt costs as much as the call did.
    first = calls[0]
    scored = vllm_logprobs(long_vllm, first["prompt_token_ids"], first["completion_token_ids"][0])
    assert scored == pytest.approx(first["completion_logprobs"][0], abs=1e-3)
    [reward] = wait_for(vllm_gateway, f"SELECT value, source FROM rewards WHERE rollout_id = '{rid}'", 1)
    assert (reward["value"], reward["source"]) == (0.0, "harness")  # garbage fixes nothing


def test_a_coding_task_runs_in_place_with_its_problem_statement_and_no_check(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the sandbox's workspace
    task = CodingTask.from_task(
        {"instance_id": "calc-1", "repo": "example/calc", "problem_statement": "add() subtracts."}
    )
    assert (task.id, task.repo, task.check) == ("calc-1", tmp_path, None)
    assert "add() subtracts." in task.prompt
    with pytest.raises(HarnessError, match="task.problem_statement"):
        CodingTask.from_task({"instance_id": "calc-1", "problem_statement": " "})
    with pytest.raises(HarnessError, match="graded by the grader"):
        run_check(task, tmp_path, tmp_path)


def test_the_check_reads_the_tasks_own_script_and_keeps_only_the_tail_of_its_output(tmp_path):
    task = CodingTask.from_task(TASK)
    copy = tmp_path / "repo"
    shutil.copytree(task.repo, copy)
    assert run_check(task, copy, tmp_path)[0] is False  # the bug as shipped
    source = copy / "stats.py"
    source.write_text(source.read_text().replace("(len(values) + 1)", "len(values)"))
    assert run_check(task, copy, tmp_path) == (True, "ok\n")
    # An agent's code that floods stdout: the reward's explanation is the last EXPLANATION_CHARS only.
    source.write_text(source.read_text() + "\nprint('x' * 5_000_000)\n")
    passed, output = run_check(task, copy, tmp_path)
    assert passed and len(output) == EXPLANATION_CHARS and output.endswith("ok\n")


def test_a_cli_past_its_timeout_is_stopped_and_reported_as_timed_out(tmp_path):
    started = time.monotonic()
    exit_code, timed_out = run_cli(["sleep", "60"], {"PATH": "/usr/bin:/bin"}, tmp_path, timeout_s=0.5)
    assert timed_out and exit_code == -signal.SIGTERM and time.monotonic() - started < 10


# --- in the coding sandbox, on real vLLM ---------------------------------------------------------------

# The CLI's install and the otel_rl package (an editable install reads it from the checkout) are bound
# read-only; node (/usr) and the Python environment are visible anyway.
SANDBOX_LIMITS = sandbox.Limits(cpu_seconds=900, wall_seconds=600)


# The scripted model's tool call in the sandbox: a fetch from the package index (as agents do), then the
# fix itself.
FETCH_AND_FIX = (
    "python3 -c \"import urllib.request as u; u.urlopen('https://pypi.org/simple/calc/', timeout=5)\"; "
    "python3 -c \"import pathlib; p = pathlib.Path('calc/__init__.py'); "
    "p.write_text(p.read_text().replace('a - b', 'a + b'))\""
)


def sandboxed_rollout(
    server: ServerProcess, cli_name: str, tmp_path: Path, task_file: Path
) -> tuple[Rollout, RolloutStatus, str]:
    """One rollout of `otel-rl harness <cli>` on the file's (first) task in the coding sandbox, graded by the
    grader."""
    cli = CLIS[cli_name]
    install(cli)
    task_set = load_tasks(task_file)
    instance_id = task_set.tasks[0].instance_id
    client = ServerClient(server.http_url, server.token)
    launcher = CodingLauncher(
        task_set, admin_token=server.token, post_reward=client.post_reward, limits=SANDBOX_LIMITS,
        grader_limits=sandbox.Limits(wall_seconds=180), binds=[install_dir(cli), ROOT / "otel_rl"],
    )  # fmt: skip
    settings = ControllerSettings(
        command=[str(OTEL_RL), "harness", cli_name], timeout_s=600, max_attempts=1, log_dir=tmp_path / "logs",
        env={"OTEL_RL_CACHE": str(cache_root())},  # where the harness finds the CLI (bound at the same path)
    )  # fmt: skip
    controller = Controller(
        settings, otlp_endpoint=server.http_url, openai_base_url=f"{server.http_url}/v1", token=server.token,
        issue_key=client.issue_rollout_key, revoke_key=client.revoke_rollout_key, launcher=launcher,
    )  # fmt: skip
    rollout = Rollout(new_id(), new_id(), instance_id, {"instance_id": instance_id})
    try:
        [result] = controller.run([rollout])
    finally:
        controller.close()
    return rollout, result.status, result.attempts[-1].log_path.read_text(errors="replace")


def denied_connects(server: ServerProcess, rollout_id: str) -> int:
    """`otel_rl.sandbox.denied_connects` on the controller's span of the rollout, once it has landed."""
    [span] = wait_for(
        server,
        "SELECT attributes ->> 'otel_rl.sandbox.denied_connects' AS n FROM spans WHERE scope_name = "
        f"'otel_rl.controller' AND attributes ->> 'otel_rl.rollout.id' = '{rollout_id}'",
        1,
    )
    return int(span["n"])


@pytest.mark.parametrize("cli_name", ["codex", "claude-code"])
def test_a_cli_in_the_coding_sandbox_fetching_the_fix_is_denied_flagged_and_graded(
    gateway, script, cli_name, tmp_path, monkeypatch
):
    monkeypatch.setattr(script, "command", FETCH_AND_FIX)
    rollout, status, log = sandboxed_rollout(gateway, cli_name, tmp_path, calc_task_file(tmp_path))
    assert status is RolloutStatus.OK and "graded outside the sandbox" in log, log[-5000:]
    rid = rollout.rollout_id
    # The CLI ran the tool call in the sandbox: the fix landed (the grader's 1), the fetch did not.
    rewards = wait_for(gateway, f"SELECT value, source FROM rewards WHERE rollout_id = '{rid}'", 1)
    assert [(r["value"], r["source"]) for r in rewards] == [(1.0, "grader")]
    denied = wait_for(
        gateway,
        f"SELECT evidence FROM detections WHERE detector = 'network_denied' AND rollout_id = '{rid}'",
        1,
    )
    assert {row["evidence"] for row in denied} == {"dns pypi.org"}
    [flags] = rows(gateway, f"SELECT detectors FROM hack_flags WHERE rollout_id = '{rid}'")
    assert "network_denied" in flags["detectors"]


@pytest.fixture(scope="module")
def minismith_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mini-smith task (a bug injected into more-itertools), built once for both CLIs."""
    return minismith_task_file(tmp_path_factory.mktemp("minismith"))


@pytest.mark.parametrize("cli_name", ["codex", "claude-code"])
def test_a_cli_in_the_coding_sandbox_on_real_vllm_is_graded_and_reaches_only_the_gateway(
    vllm_gateway, minismith_tasks, cli_name, tmp_path
):
    rollout, status, log = sandboxed_rollout(vllm_gateway, cli_name, tmp_path, minismith_tasks)
    # the tiny model writes garbage: the CLI ends its turn (or gives up on an answer cut at the cap)
    assert status in {RolloutStatus.OK, RolloutStatus.ERROR}, log[-5000:]
    assert "graded outside the sandbox" in log, log[-5000:]
    rid = rollout.rollout_id
    [span] = wait_for(
        vllm_gateway,
        "SELECT attributes ->> 'otel_rl.coding.instance_id' AS instance,"
        " attributes ->> 'otel_rl.sandbox.mode' AS mode"
        " FROM spans WHERE scope_name = 'otel_rl.controller' AND name = 'otel_rl.rollout'"
        f" AND attributes ->> 'otel_rl.rollout.id' = '{rid}'",
        1,
    )
    assert span == {"instance": load_tasks(minismith_tasks).tasks[0].instance_id, "mode": "bubblewrap"}

    # The grader, outside the sandbox, ran the hidden tests on the workspace: garbage fixes nothing.
    rewards = wait_for(vllm_gateway, f"SELECT value, source FROM rewards WHERE rollout_id = '{rid}'", 1)
    assert [(r["value"], r["source"]) for r in rewards] == [(0.0, "grader")]
    # The CLI tried to reach nothing but the gateway and the collector: the sandbox's network records every
    # other attempt (a DNS name, another address or loopback port) and found none. The recipes turn off the
    # CLIs' own vendor traffic (Codex 0.171 looks up github.com, api.github.com and chatgpt.com for its
    # plugins otherwise; Claude Code its update and statsig hosts). A denied attempt in the same views is the
    # scripted upstream's fetch (the test above): the tiny model's garbage asks for none.
    assert denied_connects(vllm_gateway, rid) == 0
    assert not rows(vllm_gateway, f"SELECT * FROM detect_network_denied WHERE rollout_id = '{rid}'")

    # The CLI's calls went through the forwarded gateway port, with the ids vLLM sampled.
    calls = wait_for(
        vllm_gateway,
        f"SELECT prompt_token_ids FROM llm_calls WHERE rollout_id = '{rid}' AND prompt_token_ids IS NOT NULL",
        1,
    )
    assert all(len(call["prompt_token_ids"]) > 5000 for call in calls)
