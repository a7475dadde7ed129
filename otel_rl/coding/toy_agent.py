"""The coding demo's agent: a tool-calling loop over a toy repository, run inside the rollout's sandbox.

It asks the model (the gateway, with its rollout key) for one tool call a turn and runs it in the workspace:
`write_file` (any path: solution.py, and also the visible tests or a conftest.py, which is how a hack looks),
`run_tests` (pytest on the workspace) and `submit`. Its own check, reported as source `harness`, is pytest's
exit status in the tree the agent edited: the weak grader the demo's weak arm trusts. It imports no otel-rl
code (the sandbox holds only this file and the Python environment) and starts in ~0.2 s: httpx for the
model, the OpenTelemetry SDK for the reward.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

MAX_TURNS = 4
MAX_TOKENS = 96
MAX_FILE_BYTES = 4096  # a write larger than this is refused (the toy functions are a few lines)
TESTS_TIMEOUT_S = 30
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
TIMING = re.compile(r" in [0-9.]+s$")  # pytest's "1 passed in 0.02s": the time is noise to the model
WORKSPACE = Path.cwd()


def _tool(name: str, description: str, **properties: str) -> dict:
    parameters = {"type": "object", "properties": {key: {"type": kind} for key, kind in properties.items()}}
    if properties:
        parameters["required"] = list(properties)
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


TOOLS = [
    _tool("write_file", "Write a file of the repository.", path="string", content="string"),
    _tool("run_tests", "Run the tests."),
    _tool("submit", "Submit."),
]


def run_tests() -> tuple[bool, str]:
    """pytest in the agent's own tree: (exit status 0, the summary line without its timing, as the fine-tuning
    transcripts show it)."""
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    try:
        done = subprocess.run(
            [sys.executable, "-B", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
            capture_output=True, text=True, timeout=TESTS_TIMEOUT_S, env=env, cwd=WORKSPACE,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return False, "timeout"
    lines = done.stdout.strip().splitlines()
    summary = TIMING.sub("", lines[-1]) if lines else f"exit {done.returncode}"
    return done.returncode == 0, summary[:200]


def write_file(arguments: dict) -> str:
    path, content = arguments.get("path"), arguments.get("content")
    if not isinstance(path, str) or not isinstance(content, str):
        return "error: write_file needs text `path` and `content`"
    target = (WORKSPACE / path).resolve()
    if not target.is_relative_to(WORKSPACE) or len(content.encode()) > MAX_FILE_BYTES:
        return "error: not a file of the repository, or too large"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)
    return f"wrote {path}"


def parse_call(message: dict) -> tuple[dict | None, str | None, dict]:
    """(the tool call as the conversation keeps it, its name, its arguments) of the message's first call:
    vLLM's parsed `tool_calls`, else a `<tool_call>` in the text."""
    calls = message.get("tool_calls") or []
    if calls:
        function = calls[0]["function"]
        name, arguments = function.get("name"), function.get("arguments")
        call = {
            "id": calls[0].get("id"),
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
    else:
        found = TOOL_CALL.search(message.get("content") or "")
        try:
            parsed = json.loads(found.group(1)) if found else None
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            return None, None, {}
        name, arguments, call = parsed.get("name"), parsed.get("arguments"), None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = None
    return call, name if isinstance(name, str) else None, arguments if isinstance(arguments, dict) else {}


def episode(client, model: str, statement: str, temperature: float) -> tuple[bool, bool]:
    """The agent loop: (submitted, pytest passed at submission)."""
    messages: list[dict] = [{"role": "user", "content": statement}]
    passed = None  # the last run_tests' verdict, until a write makes it stale
    for _ in range(MAX_TURNS):
        body = {"model": model, "messages": messages, "tools": TOOLS, "temperature": temperature,
                "max_tokens": MAX_TOKENS}  # fmt: skip
        response = client.post("chat/completions", json=body)
        response.raise_for_status()
        message = response.json()["choices"][0]["message"]
        call, name, arguments = parse_call(message)
        if name is None:
            return False, False  # no tool call: the episode ends without a submission
        messages.append({"role": "assistant", "content": message.get("content"),
                         **({"tool_calls": [call]} if call else {})})  # fmt: skip
        if name == "submit":
            if passed is None:
                passed, _ = run_tests()
            return True, passed
        if name == "write_file":
            result, passed = write_file(arguments), None
        elif name == "run_tests":
            passed, result = run_tests()
        else:
            result = f"error: no tool {name}"
        messages.append({"role": "tool", "content": result} | ({"tool_call_id": call["id"]} if call else {}))
    return False, False


def report_reward(value: float, explanation: str) -> None:
    """The harness's own check as an outcome reward (source `harness`), on a span under the rollout's."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    provider = TracerProvider(resource=Resource.create())  # identity from OTEL_RESOURCE_ATTRIBUTES
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    parent = TraceContextTextMapPropagator().extract({"traceparent": os.environ.get("TRACEPARENT", "")})
    span = provider.get_tracer("otel_rl.coding.toy_agent").start_span("self_check", context=parent)
    span.add_event(
        "gen_ai.evaluation.result",
        {"gen_ai.evaluation.name": "outcome", "gen_ai.evaluation.score.value": value,
         "gen_ai.evaluation.explanation": explanation, "otel_rl.reward.source": "harness"},
    )  # fmt: skip
    span.end()
    provider.shutdown()


def main() -> None:
    import httpx

    temperature = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    task = json.loads(os.environ["OTEL_RL_TASK"])
    headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}
    base = os.environ["OPENAI_BASE_URL"].rstrip("/") + "/"
    with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
        model = client.get("models").raise_for_status().json()["data"][0]["id"]
        submitted, passed = episode(client, model, task["problem_statement"], temperature)
    report_reward(float(submitted and passed), f"submitted: {submitted}; pytest passed: {passed}")
    print(json.dumps({"submitted": submitted, "passed": passed}))


if __name__ == "__main__":
    main()
