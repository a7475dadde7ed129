"""Capture each coding CLI's native OTLP telemetry, byte for byte, into tests/captures/cli/<cli>/.

Each CLI (installed from npm, pinned: otel_rl/harnesses/) runs the examples/coding/fix-mean task through its
harness recipe (`otel-rl harness <cli>`), against a scripted model server speaking the CLI's API (Chat
Completions, Responses or Messages: cli_upstreams.py) and an OTLP receiver that saves every export request
(receiver.py). The scripted model asks for one shell tool call (the fix), then gives a final answer.

    .venv/bin/python tests/captures/make_cli_captures.py [CLI ...]     # default: all of them
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cli_upstreams import ScriptedCodingServer
from opentelemetry.trace import SpanContext, TraceFlags
from receiver import OTLPReceiver

from otel_rl.controller.environment import harness_environment
from otel_rl.harnesses import CLIS
from otel_rl.harnesses.install import install
from otel_rl.harnesses.recipe import CodingTask, Contract, HarnessCLI, Run

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "cli"
TASK_FILE = ROOT / "examples" / "coding" / "fix-mean" / "task.json"
OTEL_RL = Path(sys.executable).parent / "otel-rl"
MODEL = "fake-model"
KEY = "capture-rollout-key"
PARENT = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, False, TraceFlags(1))
RUN_TIMEOUT_S = 300


def identity(cli: HarnessCLI) -> dict[str, str]:
    return {"otel_rl.rollout.id": f"capture-{cli.name}", "otel_rl.attempt.id": "capture-attempt-1",
            "otel_rl.group.id": "capture-group", "otel_rl.task.id": "fix-mean",
            "otel_rl.split": "train"}  # fmt: skip


def clean_environ() -> dict[str, str]:
    prefixes = ("OTEL_", "OPENAI_", "ANTHROPIC_", "TRACEPARENT", "TRACESTATE", "BAGGAGE", "CODEX_", "CLAUDE_")
    return {key: value for key, value in os.environ.items() if not key.startswith(prefixes)}


def rendered_config(cli: HarnessCLI, env: dict[str, str]) -> str:
    """The files and variables the recipe writes for a rollout, for the README (made in a scratch folder)."""
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch) / "home"
        home.mkdir()
        contract = Contract.from_environ(env)
        task = CodingTask.from_task(contract.task)
        run = Run(contract, task, Path(f"<{cli.binary}>"), MODEL, Path("<repo>"), home)
        invocation = cli.invocation(run)
        files = [
            f"`{path.relative_to(home)}`:\n\n```\n{path.read_text()}```\n"
            for path in sorted(home.rglob("*"))
            if path.is_file()
        ]
    variables = "\n".join(f"    {key}={value}" for key, value in sorted(invocation.env.items()))
    argv = " ".join(json.dumps(part) if " " in part else part for part in invocation.argv)
    text = f"Command: `{argv}`\n\nVariables added to the contract's:\n\n{variables}\n\n"
    return (text + "\n".join(files)).replace(str(home), "$HOME")


def capture(cli: HarnessCLI) -> None:
    folder = OUT / cli.name
    shutil.rmtree(folder, ignore_errors=True)
    install(cli)
    task = json.loads(TASK_FILE.read_text())
    with ScriptedCodingServer(MODEL) as model, OTLPReceiver(folder) as receiver:
        env = harness_environment(
            inherited=clean_environ(), user_env={}, otlp_endpoint=receiver.endpoint,
            openai_base_url=model.url, api_key=KEY, identity=identity(cli), parent=PARENT, task=task,
        )  # fmt: skip
        started = time.monotonic()
        result = subprocess.run(
            [str(OTEL_RL), "harness", cli.name, "--model", MODEL], env=env, cwd=ROOT,
            capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
        )  # fmt: skip
        seconds = time.monotonic() - started
        time.sleep(1)  # exports still in flight when the CLI exited
        answers = [answer.as_json() for answer in model.coding.answers]
        requests = [{"path": r.path, "user_agent": r.headers.get("user-agent")} for r in model.requests]
    if receiver.errors or result.returncode != 0:
        raise RuntimeError(f"{cli.name}: exit {result.returncode}, receiver errors {receiver.errors}\n"
                           f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")  # fmt: skip
    passed = "check passed" in result.stderr
    expected = {
        "cli": cli.name,
        "package": f"{cli.package}@{cli.version}",
        "api": cli.api,
        "identity": identity(cli),
        "parent_traceparent": env["TRACEPARENT"],
        "model_calls": answers,
        "tool_calls": [answer["tool_call"] for answer in answers if answer["tool_call"]],
        "requests": requests,
        "check_passed": passed,
        "reward": 1.0 if passed else 0.0,
    }
    (folder / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
    bodies = sorted(path.name for path in receiver.saved)
    (folder / "README.md").write_text(
        f"# {cli.name} {cli.version} (`{cli.package}`), native OTLP telemetry\n\n"
        f"Made by `tests/captures/make_cli_captures.py {cli.name}`: the fix-mean task "
        f"(examples/coding/fix-mean) run by `otel-rl harness {cli.name}` against the scripted {cli.api} "
        f"server (tests/captures/cli_upstreams.py; one shell tool call, then a final answer) and the OTLP "
        f"receiver (tests/captures/receiver.py), node {node_version()}, in {seconds:.1f} s. The check "
        f"{'passed' if passed else 'FAILED'}. Requests, in arrival order: {', '.join(bodies)}. The harness "
        "wrapper's own export (the `otel_rl.sdk` rollout span and its `gen_ai.evaluation.result` reward) is "
        "among them, with the Python exporter's user agent.\n\n"
        "`expected.json`: the model calls the scripted server answered, in order (API, tools offered, "
        "whether a tool result was in the request, streamed or not, the text or tool call answered), the "
        "tool calls, the "
        "HTTP requests the CLI made, and the reward.\n\n"
        f"## The recipe's configuration\n\n{rendered_config(cli, env)}"
    )
    print(
        f"{cli.name}: {len(bodies)} requests, {len(answers)} model calls, check passed: {passed}, "
        f"{seconds:.1f} s"
    )


def node_version() -> str:
    return subprocess.run(["node", "--version"], capture_output=True, text=True, check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("clis", nargs="*", metavar="CLI", help=f"any of {', '.join(CLIS)} (default: all)")
    names = parser.parse_args().clis or list(CLIS)
    os.chdir(ROOT)  # task paths are relative to the repository, as under the controller
    unknown = sorted(set(names) - set(CLIS))
    if unknown:
        parser.error(f"unknown CLI {', '.join(unknown)}: use {', '.join(CLIS)}")
    for name in names:
        capture(CLIS[name])


if __name__ == "__main__":
    main()
