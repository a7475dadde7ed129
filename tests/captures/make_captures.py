"""Runs each agent framework scenario against a scripted server and saves its OTLP exports in frameworks/.

    /work/main/.venv/bin/python tests/captures/make_captures.py [SCENARIO ...]   (no arguments: all)

A scenario is tests/captures/scenarios/<name>.py: an agent script run inside its own virtual environment (its
pinned REQUIREMENTS, cached under ~/.cache/otel-rl/captures/), with module-level literals that this driver
reads without importing the script: FRAMEWORK, INSTRUMENTATION, REQUIREMENTS, ENVIRONMENT (content capture
switches) and REPLIES (what the scripted server answers, in order). The script gets OPENAI_BASE_URL,
OPENAI_API_KEY, ANTHROPIC_BASE_URL (the same server speaks Messages), ANTHROPIC_API_KEY and CAPTURE_MODEL,
a receiver's OTLP/HTTP endpoint, the rollout identity in OTEL_RESOURCE_ATTRIBUTES, and writes the tools and
agents it ran to CAPTURE_REPORT (scenarios/_capture.py).
Each run replaces tests/captures/frameworks/<name>/ whole (a staging folder, then a rename).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from otel_rl.gateway.vllm_env import cache_root

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # the receiver beside this file, the upstream in tests/
from fake_vllm import MODEL, Reply, ToolCall, generate  # noqa: E402
from messages_upstream import MessagesUpstream  # noqa: E402
from receiver import OTLPReceiver  # noqa: E402

SCENARIOS = HERE / "scenarios"
FRAMEWORKS = HERE / "frameworks"
PYTHON = "python3.11"
SPEC_FIELDS = ("FRAMEWORK", "INSTRUMENTATION", "REQUIREMENTS", "ENVIRONMENT", "REPLIES")
SCRIPT_TIMEOUT_S = 300
# The harness's own environment must not leak into the capture: no endpoint, identity or key of this shell.
LEAKY_PREFIXES = ("OTEL_", "OPENAI_", "TRACELOOP_", "LOGFIRE_", "TRACEPARENT", "TRACESTATE", "BAGGAGE",
                  "PYTHONPATH", "VIRTUAL_ENV", "ANTHROPIC_", "LITELLM_")  # fmt: skip
# Vendor hosts (telemetry, model price lists, the Agents SDK's trace exporter) stay unreached: HTTP clients
# that honour the proxy variables get a closed port for anything but loopback, so a capture runs offline.
OFFLINE = {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "ALL_PROXY": "http://127.0.0.1:9",
           "NO_PROXY": "127.0.0.1,localhost"}  # fmt: skip


class ScenarioError(RuntimeError):
    """A scenario's file is malformed or its run did not produce a complete capture."""


@dataclass(frozen=True)
class ScenarioSpec:
    """What the driver knows of a scenario before running it."""

    name: str
    script: Path
    summary: str  # the script's docstring: what the agent does
    framework: str
    instrumentation: str
    requirements: tuple[str, ...]
    environment: dict[str, str]
    replies: tuple[Reply, ...]

    @property
    def rollout_id(self) -> str:
        return f"{self.name}-r1"

    def venv_dir(self) -> Path:
        recipe = "\n".join([PYTHON, *self.requirements])
        return cache_root() / "captures" / f"{self.name}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def scenario_names() -> list[str]:
    """Every scenario the driver knows: the scripts in scenarios/ (helpers start with `_`)."""
    return sorted(p.stem for p in SCENARIOS.glob("*.py") if not p.name.startswith("_"))


def load_scenario(name: str) -> ScenarioSpec:
    """A scenario's spec from the literals at the top of its script (the script itself is never imported:
    its packages live only in its own environment)."""
    script = SCENARIOS / f"{name}.py"
    if not script.is_file():
        raise ScenarioError(f"no scenario {name!r}: known are {', '.join(scenario_names())}")
    module = ast.parse(script.read_text(), filename=str(script))
    values: dict[str, Any] = {}
    for node in module.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if len(targets) == 1 and isinstance(targets[0], ast.Name) and targets[0].id in SPEC_FIELDS:
            values[targets[0].id] = ast.literal_eval(node.value)
    missing = [f for f in SPEC_FIELDS if f not in values]
    if missing:
        raise ScenarioError(f"{script}: missing literal(s) {', '.join(missing)}")
    unpinned = [r for r in values["REQUIREMENTS"] if "==" not in r]
    if unpinned:
        raise ScenarioError(f"{script}: requirements must be pinned exactly (name==version): {unpinned}")
    return ScenarioSpec(
        name=name,
        script=script,
        summary=(ast.get_docstring(module) or "").strip(),
        framework=values["FRAMEWORK"],
        instrumentation=values["INSTRUMENTATION"],
        requirements=tuple(values["REQUIREMENTS"]),
        environment=dict(values["ENVIRONMENT"]),
        replies=tuple(reply_of(r, script) for r in values["REPLIES"]),
    )


def reply_of(spec: dict[str, Any], script: Path) -> Reply:
    """A scripted reply: `{"content": str}` and/or `{"tool_calls": [{"name", "arguments", "id"}]}`."""
    try:
        calls = tuple(ToolCall(c["name"], c["arguments"], c["id"]) for c in spec.get("tool_calls", ()))
    except KeyError as exc:
        raise ScenarioError(f"{script}: a tool call in REPLIES lacks {exc} (name, arguments, id)") from None
    return Reply(content=spec.get("content", ""), tool_calls=calls)


# --- environments ------------------------------------------------------------------------------------------


def scenario_venv(spec: ScenarioSpec, console: Console) -> Path:
    """The scenario's virtual environment (made once: built in a staging folder, then renamed)."""
    target = spec.venv_dir()
    if (target / "bin" / "python").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".staging-{spec.name}-"))
    try:
        # a venv finds its prefix from where its interpreter lies, so it works renamed (its scripts' shebangs
        # do not, and nothing here runs them: pip runs as `python -m pip`)
        subprocess.run([PYTHON, "-m", "venv", str(staging)], check=True, timeout=120)
        python = str(staging / "bin" / "python")
        pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        console.log(f"{spec.name}: installing {' '.join(spec.requirements)}", markup=False)
        subprocess.run([*pip, *spec.requirements], check=True, timeout=1200)
        if (target / "bin" / "python").exists():  # another run built the same environment meanwhile
            shutil.rmtree(staging)
        else:
            staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def freeze(venv: Path) -> str:
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "freeze", "--all"],
                         check=True, capture_output=True, text=True, timeout=120)  # fmt: skip
    return out.stdout


# --- the scripted upstream ---------------------------------------------------------------------------------


@dataclass
class ScriptedReplies:
    """A FakeVLLM responder: the scenario's replies in order, keeping each request it answered."""

    replies: tuple[Reply, ...]
    answered: list[tuple[dict[str, Any], Reply]] = field(default_factory=list)
    refused: int = 0  # model calls past the script (answered 500: a client may retry them)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, request: dict[str, Any], index: int) -> Reply:
        with self._lock:
            if len(self.answered) == len(self.replies):
                self.refused += 1
                raise LookupError(f"the scenario scripts {len(self.replies)} replies: a model call too many")
            reply = self.replies[len(self.answered)]
            self.answered.append((request, reply))
            return reply


def model_call(request: dict[str, Any], reply: Reply) -> dict[str, Any]:
    """One answered model call, as expected.json lists it."""
    tools = request.get("tools") or []
    choice = generate(
        reply,
        parse_tools=bool(tools) and request.get("tool_choice") != "none",
        max_tokens=request.get("max_completion_tokens") or request.get("max_tokens"),
        call_ids=(call.id for call in reply.tool_calls),
    )
    return {
        "request": {
            "messages": len(request["messages"]),
            "roles": [m["role"] for m in request["messages"]],
            "tools": [t["function"]["name"] for t in tools if t.get("type") == "function"],
            "stream": bool(request.get("stream")),
        },
        "reply": {
            "content": choice.content,
            "tool_calls": [
                {"name": call["name"], "arguments": json.loads(call["arguments"]), "id": call["id"]}
                for call in (c["function"] | {"id": c["id"]} for c in choice.tool_calls)
            ],
            "finish_reason": choice.finish_reason,
        },
    }


# --- one run -----------------------------------------------------------------------------------------------


def scenario_env(
    spec: ScenarioSpec, *, upstream: MessagesUpstream, otlp_endpoint: str, report: Path
) -> dict[str, str]:
    inherited = {
        k: v for k, v in os.environ.items() if not k.startswith(LEAKY_PREFIXES) and k.upper() not in OFFLINE
    }
    identity = {
        "service.name": f"capture-{spec.name}",
        "otel_rl.rollout.id": spec.rollout_id,
        "otel_rl.attempt.id": f"{spec.rollout_id}-a1",
        "otel_rl.group.id": f"{spec.name}-g1",
        "otel_rl.task.id": "add",
        "otel_rl.split": "train",
    }
    return (
        inherited
        | OFFLINE
        | {
            "OPENAI_BASE_URL": upstream.url,
            "OPENAI_API_KEY": "capture-key",
            "ANTHROPIC_BASE_URL": upstream.base_url,  # the anthropic client adds /v1/messages
            "ANTHROPIC_API_KEY": "capture-key",
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_RESOURCE_ATTRIBUTES": ",".join(f"{k}={v}" for k, v in identity.items()),
            "CAPTURE_MODEL": MODEL,
            "CAPTURE_REPORT": str(report),
            "PYTHONUNBUFFERED": "1",
        }
        | spec.environment
    )


def capture(spec: ScenarioSpec, console: Console) -> Path:
    """Run the scenario once and replace its folder under frameworks/ with the complete capture."""
    venv = scenario_venv(spec, console)
    FRAMEWORKS.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=FRAMEWORKS, prefix=f".staging-{spec.name}-"))
    staging.chmod(0o755)  # mkdtemp makes it private; the capture is for everyone who reads the checkout
    try:
        replies = ScriptedReplies(spec.replies)
        report = staging / "report.json"
        with MessagesUpstream(replies) as upstream, OTLPReceiver(staging) as receiver:
            env = scenario_env(spec, upstream=upstream, otlp_endpoint=receiver.endpoint, report=report)
            result = subprocess.run([str(venv / "bin" / "python"), str(spec.script)], env=env, cwd=staging,
                                    capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)  # fmt: skip
        if result.returncode != 0:
            raise ScenarioError(
                f"{spec.name}: the script exited {result.returncode}:\n{result.stderr[-4000:]}"
            )
        if receiver.errors:
            raise ScenarioError(f"{spec.name}: the receiver refused exports: {receiver.errors}")
        if len(replies.answered) != len(spec.replies) or replies.refused:
            calls = len(replies.answered) + replies.refused
            raise ScenarioError(
                f"{spec.name}: {calls} model calls, {len(spec.replies)} replies scripted:\n"
                + result.stderr[-4000:]
            )
        if not receiver.saved:
            raise ScenarioError(f"{spec.name}: no OTLP export arrived\n{result.stderr[-4000:]}")
        ran = json.loads(report.read_text())
        report.unlink()
        expected = {
            "scenario": spec.name,
            "rollout_id": spec.rollout_id,
            "model_calls": [model_call(request, reply) for request, reply in replies.answered],
            "tools": ran["tools"],
            "agents": ran["agents"],
        }
        (staging / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
        frozen = freeze(venv)
        (staging / "venv-freeze.txt").write_text(frozen)
        (staging / "README.md").write_text(scenario_readme(spec, expected, frozen, receiver.saved))
        return replace_folder(staging, FRAMEWORKS / spec.name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def replace_folder(staging: Path, target: Path) -> Path:
    """Swap the staging folder in for the target, so that readers see the old capture or the new one whole."""
    if target.exists():
        old = target.with_name(f".old-{target.name}")
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
        staging.rename(target)
        shutil.rmtree(old)
    else:
        staging.rename(target)
    return target


# --- READMEs -----------------------------------------------------------------------------------------------


def pinned_versions(spec: ScenarioSpec, frozen: str) -> list[str]:
    """The scenario's pins, then the OpenTelemetry SDK and exporter it resolved to."""
    lines = [line for line in frozen.splitlines() if "==" in line]
    sdk = [line for line in lines if line.split("==")[0] in ("opentelemetry-sdk", "opentelemetry-api")]
    return [*spec.requirements, *(line for line in sdk if line not in spec.requirements)]


def scenario_readme(spec: ScenarioSpec, expected: dict[str, Any], frozen: str, saved: list[Path]) -> str:
    calls = expected["model_calls"]
    tools = ", ".join(
        f"`{t['name']}({json.dumps(t['arguments'])})` → {t['result']!r}" for t in expected["tools"]
    )
    lines = [
        f"# {spec.name}",
        "",
        spec.summary,
        "",
        f"- framework: {spec.framework}",
        f"- instrumentation: {spec.instrumentation}",
        f"- versions: {', '.join(f'`{v}`' for v in pinned_versions(spec, frozen))} (all: `venv-freeze.txt`)",
        f"- environment: {', '.join(f'`{k}={v}`' for k, v in spec.environment.items()) or '(none)'}",
        f"- rollout: `otel_rl.rollout.id={spec.rollout_id}` in `OTEL_RESOURCE_ATTRIBUTES`",
        f"- model calls answered by the scripted server: {len(calls)} "
        f"({', '.join('stream' if c['request']['stream'] else 'non-stream' for c in calls)})",
        f"- tools run: {tools or '(none)'}",
        f"- agents run: {', '.join(expected['agents']) or '(none)'}",
        f"- OTLP requests: {', '.join(p.name for p in saved)}",
        "",
        "Made by `tests/captures/make_captures.py`; `expected.json` lists what the server answered, in order",
        "(and the tools and agents the framework ran).",
        "",
    ]
    return "\n".join(lines)


def write_index() -> None:
    """tests/captures/frameworks/README.md: one row per captured scenario."""
    rows = []
    for name in scenario_names():
        folder = FRAMEWORKS / name
        if not (folder / "expected.json").is_file():
            continue
        spec = load_scenario(name)
        expected = json.loads((folder / "expected.json").read_text())
        requests = len(list(folder.glob("*.meta.json")))
        rows.append(
            f"| `{name}/` | {spec.framework} | {spec.instrumentation} | {', '.join(spec.requirements)} "
            f"| {len(expected['model_calls'])} | {requests} |"
        )
    text = [
        "# OTLP captures of agent frameworks",
        "",
        "Each folder holds every OTLP/HTTP request body one agent run exported, byte for byte",
        "(`NN_<signal>.*`), with its headers (`.meta.json`) and decoded form (`.decoded.json`), and",
        "`expected.json`: the model calls the scripted server answered, the tools and agents the framework",
        "ran. Made by `make_captures.py` (see its docstring); tests read them via `tests/otel_fixtures.py`.",
        "",
        "| folder | framework | instrumentation | pinned | model calls | requests |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    (FRAMEWORKS / "README.md").write_text("\n".join(text))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", help=f"default: all ({', '.join(scenario_names())})")
    names = parser.parse_args().scenarios or scenario_names()
    console = Console(stderr=True)
    specs = [load_scenario(name) for name in names]
    failed = []
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        for spec in specs:
            task = progress.add_task(spec.name, total=1)
            try:
                folder = capture(spec, console)
            except (ScenarioError, subprocess.SubprocessError) as exc:
                failed.append(spec.name)
                console.print(f"[red]{spec.name} failed[/red]: {exc}")
            else:
                saved = len(list(folder.glob("*.meta.json")))
                console.print(f"[green]{spec.name}[/green]: {saved} requests in {folder.relative_to(HERE)}")
            progress.update(task, completed=1)
    write_index()
    if failed:
        console.print(f"[red]failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
