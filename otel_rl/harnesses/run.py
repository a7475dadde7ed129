"""One rollout of a coding-agent CLI: its folder and config, the CLI under a timeout, then the check → reward
(a folder task), or nothing more (a coding task: the grader, outside the sandbox, posts the reward)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

import otel_rl
from otel_rl.harnesses.install import executable
from otel_rl.harnesses.recipe import CodingTask, Contract, HarnessCLI, HarnessError, Run

CHECK_TIMEOUT_S = 120.0
KILL_GRACE_S = 5.0
EXPLANATION_CHARS = 2000  # the tail of the check's output kept on the reward event
MAX_MODELS_BYTES = 1 << 20
# Node CLIs and their libraries look for updates and report usage unless told not to.
NO_VENDOR_TRAFFIC = {"DO_NOT_TRACK": "1", "NO_UPDATE_NOTIFIER": "1", "NPM_CONFIG_UPDATE_NOTIFIER": "false"}


@dataclass(frozen=True)
class Outcome:
    """How the CLI ended and what the check said."""

    exit_code: int  # the CLI's; negative: killed by that signal
    timed_out: bool
    passed: bool | None  # None: a coding task, graded outside the sandbox
    check_output: str


def served_model(contract: Contract) -> str:
    """The first model the gateway lists (with the rollout key): the policy the rollout calls."""
    url = f"{contract.openai_base_url}/models"
    body = bytearray()
    try:
        headers = {"authorization": f"Bearer {contract.api_key}"}
        with httpx.stream("GET", url, headers=headers, timeout=30) as response:
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_MODELS_BYTES:
                    raise HarnessError(f"{url} answered more than {MAX_MODELS_BYTES} bytes")
    except httpx.HTTPError as error:
        raise HarnessError(f"cannot list the gateway's models at {url}: {error}") from None
    text = body.decode(errors="replace")
    if response.status_code != 200:
        raise HarnessError(f"{url} answered HTTP {response.status_code}: {text[:300]}")
    try:
        return str(json.loads(text)["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise HarnessError(f"{url} lists no model: {text[:300]}") from None


def run_cli(argv: list[str], env: Mapping[str, str], cwd: Path, timeout_s: float) -> tuple[int, bool]:
    """Run the CLI to its end or its timeout: (exit status, timed out). It stays in this process's group, so
    that the controller's kill at the end of the attempt reaches whatever it started."""
    process = subprocess.Popen(argv, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL)
    try:
        return process.wait(timeout_s), False
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(KILL_GRACE_S), True
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait(), True


def run_check(task: CodingTask, repo: Path, home: Path) -> tuple[bool, str]:
    """The task's check on the agent's copy: (passed, the tail of its output). The check script is read from
    the task's own folder, never from the copy the agent could edit, and runs in isolated mode (-I: no
    PYTHONPATH, no user site, not the agent's folder on sys.path)."""
    if task.check is None:
        raise HarnessError(f"task {task.id} is graded by the grader, not by a check")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}
    with tempfile.TemporaryFile() as output:
        try:
            result = subprocess.run(
                [sys.executable, "-I", str(task.check), str(repo)],
                cwd=repo, env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                timeout=CHECK_TIMEOUT_S, check=False,
            )  # fmt: skip
            passed = result.returncode == 0
        except subprocess.TimeoutExpired:
            passed = False
        # Only the tail is read: the agent's code may print without bound.
        size = output.seek(0, os.SEEK_END)
        output.seek(max(0, size - EXPLANATION_CHARS))
        return passed, output.read().decode(errors="replace")


def run_rollout(cli: HarnessCLI, environ: Mapping[str, str], *, model: str | None = None) -> Outcome:
    """Run one rollout of `cli` on the task in OTEL_RL_TASK; a folder task's check result is its reward."""
    contract = Contract.from_environ(environ)
    task = CodingTask.from_task(contract.task)
    program = executable(cli)
    if not program.exists():
        raise HarnessError(
            f"{cli.name} {cli.version} is not installed: run `otel-rl harness install {cli.name}`"
        )
    model = model or served_model(contract)
    telemetry = otel_rl.instrument(service_name=f"otel-rl-harness-{cli.name}")
    with tempfile.TemporaryDirectory(prefix=f"otel-rl-{cli.name}-") as folder:
        repo, home = Path(folder) / "repo", Path(folder) / "home"
        if task.check is None:  # a coding task: the agent works in its sandbox's workspace, in place
            repo = task.repo
        else:
            shutil.copytree(task.repo, repo, symlinks=True)
        home.mkdir()
        with otel_rl.rollout() as rollout:
            trace_env = rollout.env()  # TRACEPARENT (and BAGGAGE) of this rollout span
            run = Run(contract, task, program, model, repo, home)
            invocation = cli.invocation(run)
            # The contract percent-encodes the header value, as the OTel spec says; the JavaScript exporters
            # of Claude Code (0.208) and opencode do not decode it and send `Bearer%20<key>`. otel-rl reads
            # that too (auth.bearer), but a collector in front of it may not: written plainly, every parser
            # reads the same value.
            headers = {"OTEL_EXPORTER_OTLP_HEADERS": f"authorization={contract.authorization}"}
            env = dict(environ) | headers | NO_VENDOR_TRAFFIC | trace_env | invocation.env
            exit_code, timed_out = run_cli(invocation.argv, env, repo, task.timeout_s)
            if task.check is None:
                telemetry.force_flush()
                return Outcome(exit_code, timed_out, None, "")
            passed, output = run_check(task, repo, home)
            # Sent with the rollout key, a reward's source is "harness" whatever it says (the collector
            # rewrites it), and that is what it is: computed beside the agent, on its machine.
            rollout.reward(1.0 if passed else 0.0, explanation=output or None)
    telemetry.force_flush()
    return Outcome(exit_code, timed_out, passed, output)
