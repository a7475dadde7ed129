"""The harness SDK end to end: real agents (official openai client, a real OpenAI instrumentation — Traceloop,
OpenInference or official openai-v2 — and OTLP exporters) against the fake vLLM server, exporting to a real
`otel-rl serve`, checked in SQL."""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest
from fake_vllm import MODEL, CalcReplies, FakeVLLM
from opentelemetry import baggage, context, trace
from opentelemetry.sdk.trace import TracerProvider

from otel_rl import attributes as attr
from otel_rl.controller.environment import harness_environment
from otel_rl.gateway.vllm_env import cache_root
from otel_rl.sdk.rollout import resolve_identity, reward
from otel_rl.sdk.setup import exporter_headers

ROOT = Path(__file__).resolve().parents[1]
CALC_AGENT = ROOT / "examples" / "calc_agent.py"
PLAIN_AGENT = ROOT / "tests" / "harnesses" / "plain_openai_agent.py"
TASK = {"id": "add-37-48-p0", "split": "train", "question": "What is 37 + 48?", "a": 37, "op": "+", "b": 48,
        "answer": 85}  # fmt: skip


# The OpenAI instrumentations besides Traceloop (which comes with otel-rl), at the versions the fixtures were
# captured with. All of them register the same entry point (`openai`), so installed together they would all
# be on under opentelemetry-instrument: the tests install each on its own and put it on a harness's path.
# Each: its requirements, and the instrumentation scope of the spans it makes.
OTHER_INSTRUMENTATIONS = {
    "openinference": (
        [
            "openinference-instrumentation-openai==0.1.66",
            "openinference-instrumentation==0.1.72",
            "openinference-semantic-conventions==0.1.42",
        ],
        "openinference.instrumentation.openai",
    ),
    "openai-v2": (
        # util-genai 1.2 moved a module that openai-v2 2.4b0 imports
        ["opentelemetry-instrumentation-openai-v2==2.4b0", "opentelemetry-util-genai==1.1b0"],
        "opentelemetry.util.genai.handler",
    ),
}


def installed_on_its_own(requirements: list[str]) -> Path:
    """A folder holding just these packages (their dependencies come from this environment), made once and
    cached beside the vLLM environment."""
    digest = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:12]
    target = cache_root() / f"instrumentation-{digest}"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(staging)]
        subprocess.run([*pip, *requirements], check=True, timeout=600)
        staging.rename(target)
    return target


# The start of every inline harness script below: `ask(text)` makes one chat call.
PRELUDE = f"""
import json, os, subprocess, sys
import openai, otel_rl

def ask(text):
    messages = [{{"role": "user", "content": text}}]
    return openai.OpenAI().chat.completions.create(model="{MODEL}", messages=messages)
"""


def write_script(path: Path, body: str) -> Path:
    path.write_text(PRELUDE + textwrap.dedent(body))
    return path


def clean_environ() -> dict[str, str]:
    """This process's environment without telemetry, OpenAI or trace-context settings."""
    prefixes = ("OTEL_", "OPENAI_", "TRACEPARENT", "TRACESTATE", "BAGGAGE")
    return {key: value for key, value in os.environ.items() if not key.startswith(prefixes)}


def sdk_env(server, fake: FakeVLLM, **extra: str) -> dict[str, str]:
    """A harness environment for the SDK path: the server's HTTP endpoint and token, the fake model server."""
    return clean_environ() | {
        "OTEL_EXPORTER_OTLP_ENDPOINT": server.http_url,
        "OTEL_RL_TOKEN": server.token,
        "OPENAI_BASE_URL": fake.url,
        "OPENAI_API_KEY": "unused",
    } | extra  # fmt: skip


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def run_ok(args: list[str], env: dict[str, str], cwd: Path) -> str:
    done = run(args, env, cwd)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def rows(server, sql: str) -> list[dict]:
    return server.sql(sql).to_pylist()


def new_id() -> str:
    return uuid.uuid4().hex


def test_calc_agent_run_shows_its_rollout_calls_and_reward_in_sql(otel_rl_server, fake_vllm, tmp_path):
    fake_vllm.script(CalcReplies())
    out = run_ok([sys.executable, str(CALC_AGENT), "--task-json", json.dumps(TASK)],
                 sdk_env(otel_rl_server, fake_vllm), tmp_path)  # fmt: skip
    result = json.loads(out)
    assert result["reward"] == 1.0
    rollout_id = result["rollout_id"]

    [rollout] = rows(otel_rl_server, f"SELECT * FROM rollouts WHERE rollout_id = '{rollout_id}'")
    assert (rollout["status"], rollout["n_calls"]) == ("ok", 2)
    # the agent's own reward, beside the trusted one (no grader's here)
    assert rollout["outcome_rewards_by_source"] == [("harness", 1.0)]
    assert rollout["outcome_reward"] is None
    assert (rollout["task_id"], rollout["split"], rollout["service_name"]) == (
        "add-37-48-p0",
        "train",
        "calc_agent",
    )

    calls = rows(
        otel_rl_server,
        "SELECT trace_id, request_model, input_messages, output_messages, dialect FROM llm_calls "
        f"WHERE rollout_id = '{rollout_id}' ORDER BY start_time_unix_nano",
    )
    assert [c["request_model"] for c in calls] == [MODEL, MODEL]
    first_output, second_output = (json.loads(c["output_messages"]) for c in calls)
    assert '"expression": "37+48"' in first_output[0]["content"]
    assert second_output[0]["content"] == "The answer is 85."
    tool_result = json.loads(calls[1]["input_messages"])[-1]
    assert (tool_result["role"], tool_result["content"]) == ("tool", "85")

    rewards = rows(otel_rl_server, f"SELECT * FROM rewards WHERE rollout_id = '{rollout_id}'")
    assert [(r["level"], r["name"], r["value"], r["source"], r["origin"]) for r in rewards] == [
        ("outcome", "outcome", 1.0, "harness", "log")
    ]

    # The model server saw each call's trace context and the rollout's identity.
    chats = [r for r in fake_vllm.requests if r.path == "/v1/chat/completions"]
    assert {r.headers["traceparent"].split("-")[1] for r in chats} == {calls[0]["trace_id"]}
    assert all(f"{attr.ROLLOUT_ID}={rollout_id}" in r.headers["baggage"] for r in chats)


@pytest.mark.parametrize("library", sorted(OTHER_INSTRUMENTATIONS))
def test_an_instrumentation_the_user_installed_records_each_call_once_instead_of_traceloop(
    otel_rl_server, fake_vllm, tmp_path, library
):
    fake_vllm.script(CalcReplies())
    requirements, scope = OTHER_INSTRUMENTATIONS[library]
    env = sdk_env(otel_rl_server, fake_vllm, PYTHONPATH=str(installed_on_its_own(requirements)))
    result = json.loads(
        run_ok([sys.executable, str(CALC_AGENT), "--task-json", json.dumps(TASK)], env, tmp_path)
    )
    assert result["reward"] == 1.0

    calls = rows(
        otel_rl_server,
        "SELECT c.input_messages, c.output_messages, s.scope_name FROM llm_calls c JOIN spans s USING "
        f"(trace_id, span_id) WHERE c.rollout_id = '{result['rollout_id']}' ORDER BY c.start_time_unix_nano",
    )
    assert [c["scope_name"] for c in calls] == [scope, scope]  # Traceloop stayed off: one span a call
    first_output, second_output = (json.loads(c["output_messages"]) for c in calls)
    assert '"expression": "37+48"' in first_output[0]["content"]
    assert second_output[0]["content"] == "The answer is 85."
    tool_result = json.loads(calls[1]["input_messages"])[-1]
    assert (tool_result["role"], tool_result["content"]) == ("tool", "85")


def test_agent_started_by_the_controller_joins_its_trace_and_identity(otel_rl_server, fake_vllm, tmp_path):
    fake_vllm.script(CalcReplies())
    identity = {attr.ROLLOUT_ID: new_id(), attr.ATTEMPT_ID: new_id(), attr.GROUP_ID: new_id(),
                attr.TASK_ID: "task 17/add", attr.SPLIT: "val"}  # fmt: skip
    sampled = trace.TraceFlags(trace.TraceFlags.SAMPLED)
    controller_span = trace.SpanContext(int(new_id(), 16), int(new_id()[:16], 16), False, sampled)
    env = harness_environment(
        inherited=clean_environ(), user_env={}, otlp_endpoint=otel_rl_server.http_url,
        openai_base_url=fake_vllm.url, api_key=otel_rl_server.token, identity=identity,
        parent=controller_span, task={"question": TASK["question"], "answer": 85},
    )  # fmt: skip
    run_ok([sys.executable, str(CALC_AGENT)], env, tmp_path)

    rollout_id = identity[attr.ROLLOUT_ID]
    [sdk_span] = rows(
        otel_rl_server,
        f"SELECT trace_id, parent_span_id, attributes FROM spans WHERE scope_name = '{attr.SDK_SCOPE}' "
        f"AND name = '{attr.SDK_ROLLOUT_SPAN_NAME}' AND attributes->>'{attr.ROLLOUT_ID}' = '{rollout_id}'",
    )
    assert sdk_span["trace_id"] == f"{controller_span.trace_id:032x}"
    assert sdk_span["parent_span_id"] == f"{controller_span.span_id:016x}"
    assert {
        k: v for k, v in json.loads(sdk_span["attributes"]).items() if k in attr.IDENTITY_KEYS
    } == identity

    [rollout] = rows(otel_rl_server, f"SELECT * FROM rollouts WHERE rollout_id = '{rollout_id}'")
    assert (rollout["attempt_id"], rollout["group_id"]) == (
        identity[attr.ATTEMPT_ID],
        identity[attr.GROUP_ID],
    )
    assert (rollout["task_id"], rollout["split"], rollout["n_calls"]) == ("task 17/add", "val", 2)
    assert rollout["outcome_rewards_by_source"] == [("harness", 1.0)]


def test_a_failing_agent_exporting_over_grpc_is_recorded_as_error_with_its_turn_reward(
    otel_rl_server, fake_vllm, tmp_path
):
    rollout_id = new_id()
    script = write_script(tmp_path / "failing_agent.py", f"""
        otel_rl.instrument()
        with otel_rl.rollout(rollout_id="{rollout_id}", task_id="t") as r:
            ask("hi")
            r.reward(0.25, name="format", label="half", span=r.last_call)  # a turn reward
            raise RuntimeError("the tool crashed")
    """)  # fmt: skip
    env = sdk_env(otel_rl_server, fake_vllm, OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                  OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{otel_rl_server.grpc_target}")  # fmt: skip
    done = run([sys.executable, str(script)], env, tmp_path)
    assert done.returncode == 1 and "the tool crashed" in done.stderr

    [rollout] = rows(
        otel_rl_server, f"SELECT status, n_calls FROM rollouts WHERE rollout_id = '{rollout_id}'"
    )
    assert (rollout["status"], rollout["n_calls"]) == ("error", 1)
    [reward] = rows(otel_rl_server, f"SELECT * FROM rewards WHERE rollout_id = '{rollout_id}'")
    [call] = rows(otel_rl_server, f"SELECT span_id FROM llm_calls WHERE rollout_id = '{rollout_id}'")
    assert (reward["level"], reward["span_id"], reward["name"], reward["value"], reward["label"]) == (
        "turn",
        call["span_id"],
        "format",
        0.25,
        "half",
    )


def test_a_child_process_started_with_rollout_env_joins_the_rollout(otel_rl_server, fake_vllm, tmp_path):
    child = write_script(tmp_path / "child.py", """
        otel_rl.instrument()
        with otel_rl.rollout() as r:
            ask("child")
        print(r.rollout_id)
    """)  # fmt: skip
    parent = write_script(tmp_path / "parent.py", f"""
        otel_rl.instrument()
        with otel_rl.rollout(task_id="t", group_id="g") as r:
            ask("parent")
            child = subprocess.run([sys.executable, "{child}"], env=os.environ | r.env(), capture_output=True)
        child_id, log = child.stdout.decode().strip(), child.stderr.decode()
        print(json.dumps({{"rollout": r.rollout_id, "child": child_id, "log": log}}))
    """)  # fmt: skip
    result = json.loads(run_ok([sys.executable, str(parent)], sdk_env(otel_rl_server, fake_vllm), tmp_path))
    assert result["child"] == result["rollout"], result["log"]
    rollout_id = result["rollout"]

    calls = rows(
        otel_rl_server,
        f"SELECT trace_id, group_id, task_id FROM llm_calls WHERE rollout_id = '{rollout_id}'",
    )
    assert len(calls) == 2 and len({c["trace_id"] for c in calls}) == 1
    assert {(c["group_id"], c["task_id"]) for c in calls} == {("g", "t")}
    assert [r.headers["baggage"].count(rollout_id) for r in fake_vllm.requests] == [1, 1]


def test_instrument_keeps_an_existing_tracer_provider_and_adds_the_identity(
    otel_rl_server, fake_vllm, tmp_path
):
    script = write_script(tmp_path / "own_provider.py", """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        mine = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(mine))
        trace.set_tracer_provider(provider)
        telemetry = otel_rl.instrument()
        with otel_rl.rollout(task_id="t") as r:
            ask("hi")
        spans = {s.name: s.attributes.get("otel_rl.rollout.id") for s in mine.get_finished_spans()}
        kept = telemetry.tracer_provider is provider
        print(json.dumps({"kept": kept, "rollout": r.rollout_id, "spans": spans}))
    """)  # fmt: skip
    result = json.loads(run_ok([sys.executable, str(script)], sdk_env(otel_rl_server, fake_vllm), tmp_path))
    assert result["kept"]
    assert result["spans"] == {"openai.chat": result["rollout"], "rollout": result["rollout"]}
    # Without an explicit endpoint, instrument() added no exporter to a provider it did not create.
    exported = f"SELECT count(*) FROM spans WHERE attributes->>'{attr.ROLLOUT_ID}' = '{result['rollout']}'"
    assert otel_rl_server.scalar(exported) == 0


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_unmodified_agent_under_opentelemetry_instrument_is_attributed_to_its_rollout(
    otel_rl_server, fake_vllm, tmp_path, protocol
):
    fake_vllm.script(["5", "You are welcome."])
    rollout_id = new_id()
    endpoint = (
        otel_rl_server.http_url if protocol == "http/protobuf" else f"http://{otel_rl_server.grpc_target}"
    )
    env = clean_environ() | {
        "OTEL_RESOURCE_ATTRIBUTES": f"{attr.ROLLOUT_ID}={rollout_id},{attr.TASK_ID}=plain",
        "OTEL_SERVICE_NAME": "plain-agent",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer%20{otel_rl_server.token}",
        "OTEL_METRICS_EXPORTER": "none",
        "OPENAI_BASE_URL": fake_vllm.url,
        "OPENAI_API_KEY": "unused",
    }  # fmt: skip
    if protocol == "http/protobuf":  # gRPC is the zero-code default: leave it unset
        env["OTEL_EXPORTER_OTLP_PROTOCOL"] = protocol
    opentelemetry_instrument = Path(sys.executable).parent / "opentelemetry-instrument"
    assert run_ok([str(opentelemetry_instrument), sys.executable, str(PLAIN_AGENT)], env, tmp_path).strip()

    calls = rows(
        otel_rl_server,
        "SELECT task_id, service_name, output_messages FROM llm_calls "
        f"WHERE rollout_id = '{rollout_id}' ORDER BY start_time_unix_nano",
    )
    assert [(c["task_id"], c["service_name"]) for c in calls] == [("plain", "plain-agent")] * 2
    assert json.loads(calls[1]["output_messages"])[0]["content"] == "You are welcome."


# --- pure parts, in this process (no global providers are set here) -----------------------------------


def test_identity_comes_from_arguments_then_baggage_then_resource_attributes():
    environ = {"OTEL_RESOURCE_ATTRIBUTES": "service.name=x,otel_rl.rollout.id=from-env,otel_rl.task.id=a%2Fb"}
    parent = baggage.set_baggage(
        attr.GROUP_ID, "from-baggage", baggage.set_baggage(attr.ROLLOUT_ID, "b-rollout")
    )
    identity = resolve_identity({attr.GROUP_ID: "given", attr.SPLIT: None}, parent, environ)
    assert identity == {
        attr.ROLLOUT_ID: "b-rollout",
        attr.GROUP_ID: "given",
        attr.TASK_ID: "a/b",
        attr.SPLIT: "train",
    }
    fresh = resolve_identity({}, context.Context(), {})
    assert len(fresh[attr.ROLLOUT_ID]) == 32 and fresh[attr.SPLIT] == "train"


def test_exporter_token_from_otlp_headers_then_otel_rl_token_then_the_token_file(tmp_path):
    token_file = tmp_path / "token"
    headers = "authorization=Bearer%20from-headers,x-team=rl"
    assert exporter_headers({"OTEL_EXPORTER_OTLP_HEADERS": headers, "OTEL_RL_TOKEN": "t"}, token_file) is None
    assert exporter_headers(
        {"OTEL_EXPORTER_OTLP_HEADERS": "x-team=rl", "OTEL_RL_TOKEN": "t"}, token_file
    ) == {
        "x-team": "rl",
        "authorization": "Bearer t",
    }
    assert exporter_headers({}, token_file) is None
    token_file.write_text("from-file\n")
    assert exporter_headers({}, token_file) == {"authorization": "Bearer from-file"}


def test_reward_needs_a_finite_value_and_a_span():
    with pytest.raises(ValueError, match="no span"):
        reward(1.0)
    span = TracerProvider().get_tracer("test").start_span("rollout")
    with pytest.raises(ValueError, match="finite number"):
        reward(float("nan"), span=span)
    with pytest.raises(ValueError, match="finite number"):
        reward(True, span=span)  # type: ignore[arg-type]
