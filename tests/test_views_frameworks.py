"""The views over the project's own captures of agent frameworks (tests/captures/frameworks/): each capture
POSTed as captured to a real `otel-rl serve`, read back through its SQL API, and compared with what the
scripted server answered and what the framework ran (each scenario's expected.json)."""

import json

import httpx
import pytest
from otel_fixtures import CLI_CAPTURES, Scenario, framework_captures, requests_under

# Every framework × instrumentation the views must recognize (issue 14): a capture missing from the
# repository fails here rather than shrinking the parametrized tests below.
SCENARIOS = {
    "anthropic-two-instrumentations",
    "crewai-openinference",
    "google-adk",
    "haystack-agent",
    "langgraph-openinference",
    "langgraph-openinference-openai",
    "langgraph-traceloop",
    "litellm-openinference",
    "litellm-otel",
    "llamaindex",
    "openai-agents-logfire",
    "openai-agents-openinference",
    "openai-agents-otel-contrib",
    "openai-agents-traceloop",
    "openai-agents-traceloop-openai",
    "pydantic-ai",
    "strands-agents",
    "strands-agents-latest-semconv",
}
# Instrumentations that record no finish reason for a call (their rows have finish_reasons NULL), and those
# that record no output at all (Traceloop's openai-agents: a call's answer shows in the next call's input).
# The contrib openai-agents-v2 writes the answer as the Python repr of the Responses object, not as messages.
NO_FINISH_REASONS = {
    "openai-agents-logfire",
    "openai-agents-openinference",
    "openai-agents-otel-contrib",
    "openai-agents-traceloop",
}
NO_OUTPUT = {"openai-agents-traceloop"}
OUTPUT_AS_PYTHON_REPR = {"openai-agents-otel-contrib"}
# LiteLLM and the anthropic client alone are no agents: the script ran the tool, no span records it.
# Haystack's tracer records the ToolInvoker component's run, not each tool's.
NO_TOOL_SPANS = {"anthropic-two-instrumentations", "haystack-agent", "litellm-openinference", "litellm-otel"}
# Google ADK records "stop" for every answer, tool calls included (as LiteLLM's response reached it), and
# sends a function's result back to the model wrapped as {"result": ...}.
RECORDED_FINISH_REASON = {"google-adk": "stop"}
WRAPPED_TOOL_RESULTS = {"google-adk"}
# LlamaIndex's instrumentation does not record the agent's name: its run is the root chain FunctionAgent.run.
AGENT_NAMES = {"llamaindex": ["FunctionAgent.run"]}
CAPTURES = {scenario.name: scenario for scenario in framework_captures()}


def test_every_framework_scenario_is_captured() -> None:
    assert set(CAPTURES) == SCENARIOS


class Runs:
    """The server holding every framework capture, and the views' rows of each scenario (read once)."""

    def __init__(self, server) -> None:  # noqa: ANN001 - tests/otel_rl_server.ServerProcess
        self.server = server
        self._rows: dict[tuple[str, str], list[dict]] = {}

    def rows(self, view: str, scenario: Scenario) -> list[dict]:
        """A view's rows of the scenario's traces (found by its resource's instance id), oldest first."""
        if (view, scenario.name) not in self._rows:
            instance = f"resource_attributes ->> 'service.instance.id' = '{instance_of(scenario)}'"
            traces = f"SELECT trace_id FROM spans WHERE {instance}"
            trace_column = "coalesce(trace_id, tool_trace_id)" if view == "tool_calls" else "trace_id"
            order = {"llm_calls": "start_time_unix_nano", "agent_steps": "start_time_unix_nano"}
            rows = self.server.sql(
                f"SELECT * FROM {view} WHERE {trace_column} IN ({traces}) "
                f"ORDER BY {order.get(view, 'coalesce(span_id, tool_span_id)')}"
            )
            self._rows[view, scenario.name] = rows.to_pylist()
        return self._rows[view, scenario.name]


@pytest.fixture(scope="module")
def runs(otel_rl_server) -> Runs:
    """Every framework capture POSTed as captured (in its recorded order) to the shared server."""
    for scenario in CAPTURES.values():
        for captured in scenario.requests:
            response = httpx.post(
                f"{otel_rl_server.http_url}/v1/{captured.signal}",
                content=captured.body,
                headers=captured.headers | otel_rl_server.auth,
                timeout=30,
            )
            assert response.status_code == 200, (captured.name, response.text)
    return Runs(otel_rl_server)


def instance_of(scenario: Scenario) -> str:
    """The service.instance.id of the scenario's exports (each capture run has its own)."""
    traces = next(r for r in scenario.requests if r.signal == "traces")
    resource = traces.decoded.resource_spans[0].resource
    return {kv.key: kv.value.string_value for kv in resource.attributes}["service.instance.id"]


def arguments_of(text: str | None) -> object:
    """Tool-call arguments as data (libraries differ in JSON spacing; none recorded reads as {})."""
    return json.loads(text) if text else {}


def scenario_ids() -> list[str]:
    return sorted(CAPTURES)


@pytest.mark.parametrize("name", scenario_ids())
def test_llm_calls_has_each_answered_model_call_once_in_order(runs: Runs, name: str) -> None:
    scenario = CAPTURES[name]
    calls = runs.rows("llm_calls", scenario)
    expected = scenario.expected["model_calls"]
    assert len(calls) == len(expected), [(c["scope_name"], c["dialect"]) for c in calls]
    for call, want in zip(calls, expected, strict=True):
        reply = want["reply"]
        if name in NO_OUTPUT:
            assert call["output_messages"] is None
            continue
        if name in OUTPUT_AS_PYTHON_REPR:
            (output,) = json.loads(call["output_messages"])
            assert output["content"].startswith("{'id': ") and output["tool_calls"] is None
            continue
        (output,) = json.loads(call["output_messages"])
        assert output["content"] == reply["content"]
        asked = [(t["name"], arguments_of(t["arguments"])) for t in output["tool_calls"] or []]
        assert asked == [(t["name"], t["arguments"]) for t in reply["tool_calls"]]
        if name in NO_FINISH_REASONS:
            assert call["finish_reasons"] is None
        else:
            assert call["finish_reasons"] == [RECORDED_FINISH_REASON.get(name, reply["finish_reason"])]


@pytest.mark.parametrize("name", scenario_ids())
def test_llm_calls_have_the_messages_the_server_received(runs: Runs, name: str) -> None:
    scenario = CAPTURES[name]
    for call, want in zip(runs.rows("llm_calls", scenario), scenario.expected["model_calls"], strict=False):
        inputs = json.loads(call["input_messages"])
        assert [m["role"] for m in inputs] == want["request"]["roles"]


@pytest.mark.parametrize("name", scenario_ids())
def test_the_rollout_of_the_capture_reaches_every_call_tool_and_step(runs: Runs, name: str) -> None:
    scenario = CAPTURES[name]
    views = {
        "llm_calls": True,
        "tool_calls": True,
        "agent_steps": bool(scenario.expected["agents"]),
    }
    for view, has_rows in views.items():
        rows = runs.rows(view, scenario)
        assert bool(rows) == has_rows, view
        assert {row["rollout_id"] for row in rows} <= {scenario.rollout_id}, view


@pytest.mark.parametrize("name", scenario_ids())
def test_tool_calls_have_the_tools_the_framework_ran_with_their_results(runs: Runs, name: str) -> None:
    scenario = CAPTURES[name]
    rows = runs.rows("tool_calls", scenario)
    by_name = {}
    for row in rows:
        by_name.setdefault(row["name"], []).append(row)
    for tool in scenario.expected["tools"]:
        (row,) = by_name[tool["name"]]
        assert arguments_of(row["arguments"]) == tool["arguments"]
        result = {"result": tool["result"]} if name in WRAPPED_TOOL_RESULTS else tool["result"]
        assert json.loads(row["result"]) == result
        # the span that ran it, joined to the call that asked
        assert (row["tool_span_id"] is None) == (name in NO_TOOL_SPANS)
    if name in NO_OUTPUT | OUTPUT_AS_PYTHON_REPR:
        return  # no recorded answer asks for a tool: the tool spans are the rows
    # every tool the models asked for is one row (the handoffs' transfer tools included)
    asked = [t["name"] for call in scenario.expected["model_calls"] for t in call["reply"]["tool_calls"]]
    assert sorted(row["name"] for row in rows if row["span_id"]) == sorted(asked)


@pytest.mark.parametrize("name", scenario_ids())
def test_agent_steps_have_the_agents_the_framework_ran(runs: Runs, name: str) -> None:
    scenario = CAPTURES[name]
    steps = runs.rows("agent_steps", scenario)
    agents = [s["agent_name"] for s in steps if s["kind"] == "agent"]
    assert set(AGENT_NAMES.get(name, scenario.expected["agents"])) <= set(agents), agents
    assert all(s["started_at"] is not None and s["duration_ms"] >= 0 for s in steps)


# ---------------------------------------------------------------- the coding CLIs' native telemetry

CLIS = {"claude-code", "codex", "opencode", "qwen-code"}
# CLIs whose call spans carry the messages (Codex's and Claude Code's carry usage and finish reasons only).
CLI_CONTENT = {"opencode", "qwen-code"}
# Codex's spans record no finish reason.
CLI_NO_FINISH_REASONS = {"codex"}
# CLIs whose own records name a session, with its prompts and usage (harness_sessions).
CLI_SESSIONS = {"claude-code": "claude_code", "codex": "codex", "qwen-code": "qwen_code"}


def cli_expected(cli: str) -> dict:
    return json.loads((CLI_CAPTURES / cli / "expected.json").read_text())


def test_every_cli_is_captured() -> None:
    assert {p.name for p in CLI_CAPTURES.iterdir() if p.is_dir()} == CLIS


@pytest.fixture(scope="module")
def cli_server(otel_rl_server):  # noqa: ANN201 - tests/otel_rl_server.ServerProcess
    """Every CLI capture POSTed as captured to the shared server (one trace holds them all: the capture
    script gave each CLI the same parent traceparent, so only their rollout ids tell them apart)."""
    for cli in sorted(CLIS):
        for captured in requests_under(CLI_CAPTURES / cli, CLI_CAPTURES):
            response = httpx.post(
                f"{otel_rl_server.http_url}/v1/{captured.signal}",
                content=captured.body,
                headers=captured.headers | otel_rl_server.auth,
                timeout=30,
            )
            assert response.status_code == 200, (captured.name, response.text)
    return otel_rl_server


def rollout_rows(server, view: str, rollout_id: str, order: str) -> list[dict]:  # noqa: ANN001
    return server.sql(f"SELECT * FROM {view} WHERE rollout_id = '{rollout_id}' ORDER BY {order}").to_pylist()


@pytest.mark.parametrize("cli", sorted(CLIS))
def test_a_cli_s_model_calls_are_llm_calls_rows(cli_server, cli: str) -> None:
    expected = cli_expected(cli)
    calls = rollout_rows(
        cli_server, "llm_calls", expected["identity"]["otel_rl.rollout.id"], "start_time_unix_nano"
    )
    assert len(calls) == len(expected["model_calls"])
    for call, want in zip(calls, expected["model_calls"], strict=True):
        asked = want["tool_call"]
        if cli in CLI_NO_FINISH_REASONS:
            assert call["finish_reasons"] is None
        else:
            assert call["finish_reasons"] == ["tool_calls" if asked else "stop"]
        assert call["request_model"] == "fake-model"
        if cli in CLI_CONTENT:
            (output,) = json.loads(call["output_messages"])
            assert output["content"] == want["text"]
            tool_calls = [(t["name"], arguments_of(t["arguments"])) for t in output["tool_calls"] or []]
            assert tool_calls == ([(asked["name"], asked["arguments"])] if asked else [])


@pytest.mark.parametrize("cli", sorted(CLIS))
def test_a_cli_s_tool_calls_have_their_arguments_and_results(cli_server, cli: str) -> None:
    expected = cli_expected(cli)
    rows = rollout_rows(cli_server, "tool_calls", expected["identity"]["otel_rl.rollout.id"], "tool_call_id")
    assert [(r["tool_call_id"], r["name"], arguments_of(r["arguments"])) for r in rows] == [
        (t["id"], t["name"], t["arguments"]) for t in expected["tool_calls"]
    ]
    # Claude Code logs the tool's input, not its output
    assert all(r["result"] is not None for r in rows) or cli == "claude-code"


@pytest.mark.parametrize("cli", sorted(CLI_SESSIONS))
def test_a_cli_s_session_has_its_prompt_requests_and_usage(cli_server, cli: str) -> None:
    expected = cli_expected(cli)
    rollout_id = expected["identity"]["otel_rl.rollout.id"]
    (session,) = rollout_rows(cli_server, "harness_sessions", rollout_id, "session_id")
    assert session["harness"] == CLI_SESSIONS[cli]
    assert session["session_id"] and session["model"] == "fake-model"
    assert len(session["prompts"]) == 1 and "stats.py" in session["prompts"][0]
    assert session["n_api_requests"] == len(expected["model_calls"])
    assert session["input_tokens"] > 0 and session["output_tokens"] > 0
    assert session["n_tool_results"] == len(expected["tool_calls"])
