"""The normalized views (transforms/*.sql) over every captured fixture and over spans made with the OTel SDK,
all sent to a real `otel-rl serve` over OTLP/HTTP in their real encoding and read back through its SQL API."""

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode
from otel_fixtures import captured_requests

from otel_rl import attributes as attr

WEATHER = {"city": "Paris", "temp_c": 18, "condition": "sunny"}
ANSWER = "It is 18°C and sunny in Paris."
DIALECTS = {
    "oi_default": "openinference",
    "oi_default_json_gzip": "openinference",
    "oi_genai_semconv": "openinference",
    "tl_default": "semconv",
    "tl_default_json": "semconv",
    "tl_events_gzip": "legacy_events",
    "v2_ug04_latest_span_only": "semconv",
    "v2_ug04_legacy_content": "legacy_events",
    "v2_ug04_legacy_nocontent": "legacy_events",
    "v2_ug11_default_nocontent": "semconv",
    "v2_ug11_latest_event_only": "semconv_event",
    "v2_ug11_latest_span_and_event_json": "semconv",
    "v2_ug11_latest_span_only": "semconv",
}
NO_CONTENT = {"v2_ug04_legacy_nocontent", "v2_ug11_default_nocontent"}
WITH_CONTENT = sorted(set(DIALECTS) - NO_CONTENT)
UTIL_GENAI_AGENT = {
    "v2_ug04_latest_span_only",
    "v2_ug11_latest_span_and_event_json",
    "v2_ug11_latest_span_only",
}
OPENINFERENCE = [run for run, dialect in DIALECTS.items() if dialect == "openinference"]
# Scenarios in capture order (the fixtures README); util-genai's agent adds two calls in three runs.
SCENARIOS = ("agent_1", "agent_2", "stream", "stream_tool", "n2", "error", "util_genai_1", "util_genai_2")


# ---------------------------------------------------------------- the captured fixtures, through the server


class FixtureRuns:
    """The server holding every captured export, and the views' rows of each fixture run (read once).

    Runs are told apart by their resource's service.instance.id.
    """

    def __init__(self, server) -> None:  # noqa: ANN001 - tests/otel_rl_server.ServerProcess
        self.server = server
        self.instances: dict[str, str] = {}
        self._rows: dict[tuple[str, str], list[dict]] = {}

    def rows(self, view: str, run: str) -> list[dict]:
        """Rows of a view for one run, oldest call first, with the JSON columns parsed."""
        if (view, run) not in self._rows:
            traces = f"SELECT trace_id FROM spans WHERE {self.where(run)}"
            order = "start_time_unix_nano" if view == "llm_calls" else "trace_id"
            rows = self.server.sql(f"SELECT * FROM {view} WHERE trace_id IN ({traces}) ORDER BY {order}")
            self._rows[view, run] = [parse_json_columns(row) for row in rows.to_pylist()]
        return self._rows[view, run]

    def calls(self, run: str) -> dict[str, dict]:
        """The run's llm_calls rows by scenario."""
        return dict(zip(SCENARIOS, self.rows("llm_calls", run), strict=False))

    def where(self, run: str) -> str:
        """A predicate on a spans or logs row: it belongs to the run."""
        return f"resource_attributes ->> 'service.instance.id' = '{self.instances[run]}'"


def parse_json_columns(row: dict) -> dict:
    for column in ("input_messages", "output_messages", "tool_definitions", "sampling_params"):
        if row.get(column) is not None:
            row[column] = json.loads(row[column])
    return row


@pytest.fixture(scope="module")
def fixture_runs(otel_rl_server) -> FixtureRuns:
    """Every captured export POSTed as captured to the shared server (stored once however often sent)."""
    runs = FixtureRuns(otel_rl_server)
    for captured in captured_requests():
        response = httpx.post(
            f"{otel_rl_server.http_url}/v1/{captured.signal}",
            content=captured.body,
            headers=captured.headers | otel_rl_server.auth,
            timeout=30,
        )
        assert response.status_code == 200, (captured.name, response.text)
        if captured.signal == "traces":
            resource = captured.decoded.resource_spans[0].resource
            instance = {kv.key: kv.value.string_value for kv in resource.attributes}["service.instance.id"]
            runs.instances[captured.name.split("/")[1]] = instance
    return runs


def tool_call(name: str, arguments: dict, call_id: str = "call_fake0weather") -> dict:
    return {"id": call_id, "name": name, "arguments": arguments}


def tool_calls_of(message: dict) -> list[dict]:
    """A message's tool calls with their arguments parsed (libraries differ in JSON spacing)."""
    return [call | {"arguments": json.loads(call["arguments"])} for call in message["tool_calls"] or []]


@pytest.mark.parametrize("run", sorted(DIALECTS))
def test_each_run_has_one_llm_calls_row_per_model_call_in_its_dialect(fixture_runs, run: str) -> None:
    calls = fixture_runs.rows("llm_calls", run)
    assert len(calls) == (8 if run in UTIL_GENAI_AGENT else 6)
    assert {c["dialect"] for c in calls} == {DIALECTS[run]}
    assert {c["provider"] for c in calls} == {"openai"}
    assert [c["request_model"] for c in calls].count("does-not-exist") == 1
    assert {c["service_name"] for c in calls} == {"otelcap-agent"}


@pytest.mark.parametrize("run", WITH_CONTENT)
def test_the_agent_asks_for_a_tool_and_gets_its_result_back(fixture_runs, run: str) -> None:
    calls = fixture_runs.calls(run)
    first, second = calls["agent_1"], calls["agent_2"]
    assert [m["role"] for m in first["input_messages"]] == ["system", "user"]
    assert first["input_messages"][1]["content"] == "What's the weather in Paris?"
    (asked,) = first["output_messages"]
    assert tool_calls_of(asked) == [tool_call("get_weather", {"city": "Paris"})]
    assert first["finish_reasons"] == ["tool_calls"]
    if run.startswith(("oi_", "tl_default")):  # the official v2 and legacy events record no definitions
        assert first["tool_definitions"][0]["function"]["name"] == "get_weather"

    assistant, tool = second["input_messages"][2:]
    assert tool_calls_of(assistant) == [tool_call("get_weather", {"city": "Paris"})]
    assert json.loads(tool["content"]) == WEATHER
    # Traceloop's legacy gen_ai.tool.message drops the call id; every other dialect keeps it
    assert tool["tool_call_id"] == (None if run == "tl_events_gzip" else "call_fake0weather")
    assert second["output_messages"][0]["content"] == ANSWER
    assert second["finish_reasons"] == ["stop"]

    (requested,) = [r for r in fixture_runs.rows("tool_calls", run) if r["span_id"] == first["span_id"]]
    assert (requested["choice_index"], requested["name"]) == (0, "get_weather")
    assert json.loads(requested["arguments"]) == {"city": "Paris"}
    # matched by id, or (Traceloop legacy) by its place after the assistant message
    assert requested["tool_call_id"] == "call_fake0weather"
    assert json.loads(requested["result"]) == WEATHER


@pytest.mark.parametrize("run", sorted(set(WITH_CONTENT) - {"tl_events_gzip"}))
def test_a_streamed_answer_is_assembled_into_one_message(fixture_runs, run: str) -> None:
    stream = fixture_runs.calls(run)["stream"]
    assert [m["content"] for m in stream["output_messages"]] == [ANSWER]
    assert stream["finish_reasons"] == ["stop"]
    # the official v2 instrumentation never says whether a call streamed
    assert stream["streaming"] is (None if run.startswith("v2_") else True)
    agent = fixture_runs.calls(run)["agent_1"]
    assert agent["streaming"] is (None if run.startswith("v2_") else False)


@pytest.mark.parametrize("run", sorted(set(WITH_CONTENT) - {"tl_events_gzip"}))
def test_a_streamed_tool_call_is_assembled_with_its_arguments(fixture_runs, run: str) -> None:
    stream_tool = fixture_runs.calls(run)["stream_tool"]
    (message,) = stream_tool["output_messages"]
    assert tool_calls_of(message) == [tool_call("get_weather", {"city": "Paris"})]
    assert message["content"] is None  # the empty leading text part some libraries send is no content
    assert stream_tool["finish_reasons"] == ["tool_calls"]


@pytest.mark.parametrize("run", sorted(DIALECTS))
def test_n2_gives_two_choices(fixture_runs, run: str) -> None:
    n2 = fixture_runs.calls(run)["n2"]
    assert n2["n_choices"] == 2
    assert n2["finish_reasons"] == ["stop", "stop"]
    if run not in NO_CONTENT:
        texts = [m["content"] for m in n2["output_messages"]]
        assert texts == [ANSWER, "Paris: sunny, 18 degrees Celsius."]


@pytest.mark.parametrize("run", sorted(DIALECTS))
def test_a_failed_call_is_an_error_with_its_exception_class(fixture_runs, run: str) -> None:
    error = fixture_runs.calls(run)["error"]
    assert error["is_error"] is True
    # also from util-genai 1.1b0's "<class 'openai.NotFoundError'>"
    assert error["error_type"] == "NotFoundError"
    assert error["request_model"] == "does-not-exist"
    assert error["output_messages"] is None and error["n_choices"] is None
    others = [call for scenario, call in fixture_runs.calls(run).items() if scenario != "error"]
    assert not any(call["is_error"] for call in others)


@pytest.mark.parametrize("run", sorted(DIALECTS))
def test_request_parameters_and_usage(fixture_runs, run: str) -> None:
    first = fixture_runs.calls(run)["agent_1"]
    assert (first["temperature"], first["top_p"], first["max_tokens"]) == (0.2, 0.9, 128)
    assert first["seed"] == (None if run.startswith("tl_") else 42)  # Traceloop does not record the seed
    assert (first["input_tokens"], first["output_tokens"]) == (25, 21)
    # the fixtures' server reported no cached prompt tokens; OpenAI's v2 instrumentation records none
    assert first["cache_read_tokens"] == (None if run.startswith("v2_") else 0)
    # as sent: Traceloop strips the "Qwen/" organisation prefix
    assert first["response_model"] == ("Qwen3-0.6B" if run.startswith("tl_") else "Qwen/Qwen3-0.6B")
    assert first["duration_ms"] > 0 and first["started_at"] is not None


@pytest.mark.parametrize("run", OPENINFERENCE)
def test_openinference_token_ids_and_logprobs_are_exactly_those_of_the_raw_response(
    fixture_runs, run: str
) -> None:
    raw = fixture_runs.server.sql(
        "SELECT span_id, content_attributes ->> 'output.value' AS response FROM spans "
        f"WHERE {fixture_runs.where(run)} AND content_attributes ->> 'output.value' IS NOT NULL"
    ).to_pylist()
    responses = {row["span_id"]: json.loads(row["response"]) for row in raw}
    calls = {c["span_id"]: c for c in fixture_runs.rows("llm_calls", run)}
    assert len(responses) == 5  # every call but the failed one
    for span_id, response in responses.items():
        call, choices = calls[span_id], response["choices"]
        assert call["prompt_token_ids"] == response["prompt_token_ids"]
        assert call["completion_token_ids"] == [choice["token_ids"] for choice in choices]
        logprobs = [[t["logprob"] for t in (c.get("logprobs") or {}).get("content", [])] for c in choices]
        if any(logprobs):
            expected = [np.float32(lp).tolist() for lp in logprobs]
            assert call["completion_logprobs"] == expected
        else:  # the streamed tool call's reconstructed response has no logprobs
            assert call["completion_logprobs"] is None


@pytest.mark.parametrize("run", OPENINFERENCE)
def test_openinference_flattened_attributes_give_the_messages_of_the_request_body(
    fixture_runs, run: str
) -> None:
    """The llm.input_messages.N fallback (for spans whose input.value is not JSON) agrees with input.value."""
    rows = fixture_runs.server.sql(
        "SELECT to_json(oi_messages(s.content_attributes, 'llm.input_messages.')) AS flat, c.input_messages "
        "FROM spans s JOIN llm_calls c USING (trace_id, span_id) "
        f"WHERE s.{fixture_runs.where(run)}"
    ).to_pylist()
    assert len(rows) == 6
    for row in rows:
        assert json.loads(row["flat"]) == json.loads(row["input_messages"])


def test_legacy_content_events_are_joined_and_the_unjoinable_ones_counted(fixture_runs) -> None:
    legacy = fixture_runs.calls("v2_ug04_legacy_content")
    assert [m["role"] for m in legacy["agent_2"]["input_messages"]] == ["system", "user", "assistant", "tool"]
    unjoined = fixture_runs.server.sql(
        "SELECT event_name, reason, body FROM unjoined_events "
        f"WHERE content_key IN (SELECT content_key FROM logs WHERE {fixture_runs.where('tl_events_gzip')})"
    ).to_pylist()
    # Traceloop emits a streamed call's gen_ai.choice after its span ended: no span context to join by
    assert [(u["event_name"], u["reason"]) for u in unjoined] == [("gen_ai.choice", "no_span_context")] * 2
    tl_stream = fixture_runs.calls("tl_events_gzip")["stream"]
    assert tl_stream["output_messages"] is None and tl_stream["finish_reasons"] == ["stop"]
    all_runs = " OR ".join(fixture_runs.where(run) for run in DIALECTS if run != "tl_events_gzip")
    others = fixture_runs.server.scalar(
        "SELECT count(*) FROM unjoined_events "
        f"WHERE content_key IN (SELECT content_key FROM logs WHERE {all_runs})"
    )
    assert others == 0


# ---------------------------------------------------------------- spans made with the OTel SDK


@contextmanager
def telemetry(server, resource: dict) -> Iterator[tuple[TracerProvider, LoggerProvider]]:
    """Tracer and logger providers exporting each span and record at once to the server over OTLP/HTTP."""
    headers = server.auth
    tracer_provider = TracerProvider(resource=Resource.create(resource))
    tracer_provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{server.http_url}/v1/traces", headers=headers))
    )
    logger_provider = LoggerProvider(resource=Resource.create(resource))
    logger_provider.add_log_record_processor(
        SimpleLogRecordProcessor(OTLPLogExporter(endpoint=f"{server.http_url}/v1/logs", headers=headers))
    )
    yield tracer_provider, logger_provider
    tracer_provider.shutdown()
    logger_provider.shutdown()


def chat_attributes(text: str) -> dict:
    """A latest-semconv chat span's attributes (what Traceloop or util-genai record)."""
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "tiny",
        "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": text}]}]),
        "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": "ok"}], "finish_reason": "stop"}]
        ),
    }


def evaluation(name: str, value: float, source: str) -> dict:
    return {attr.EVALUATION_NAME: name, attr.EVALUATION_SCORE_VALUE: value, attr.REWARD_SOURCE: source}


def identity(rollout_id: str, **more: str) -> dict:
    return {attr.ROLLOUT_ID: rollout_id} | {f"otel_rl.{key}": value for key, value in more.items()}


def emit_reward(
    logger_provider: LoggerProvider, span: trace.Span, name: str, value: float, source: str
) -> None:
    """A gen_ai.evaluation.result log record parented to `span`, as otel_rl.reward() emits it."""
    logger_provider.get_logger(attr.SDK_SCOPE).emit(
        timestamp=time.time_ns(),
        context=trace.set_span_in_context(span),
        event_name=attr.EVALUATION_EVENT,
        attributes={
            attr.EVALUATION_NAME: name,
            attr.EVALUATION_SCORE_VALUE: value,
            attr.REWARD_SOURCE: source,
        },
    )


def test_a_rollout_from_span_and_baggage_attributes_with_its_rewards(otel_rl_server) -> None:
    rollout_id = uuid.uuid4().hex
    ids = identity(rollout_id, **{"attempt.id": "a1", "group.id": "g1", "task.id": "t1", "split": "train"})
    with telemetry(otel_rl_server, {"service.name": "views-harness"}) as (tracer_provider, logger_provider):
        tracer = tracer_provider.get_tracer(attr.SDK_SCOPE)
        with tracer.start_as_current_span(attr.SDK_ROLLOUT_SPAN_NAME, attributes=ids) as root:
            # the SDK copies the identity from baggage onto the spans of the rollout ...
            with tracer.start_as_current_span("chat tiny", attributes=chat_attributes("one") | ids) as turn:
                emit_reward(logger_provider, turn, "format", 0.5, "grader")
            # ... a library's span that does not copy it inherits it from its trace
            tracer.start_span("chat tiny", attributes=chat_attributes("two")).end()
            root.add_event(
                attr.EVALUATION_EVENT,
                {
                    attr.EVALUATION_NAME: "outcome",
                    attr.EVALUATION_SCORE_VALUE: 1.0,
                    attr.REWARD_SOURCE: "harness",
                },
            )

    (rollout,) = otel_rl_server.sql(f"SELECT * FROM rollouts WHERE rollout_id = '{rollout_id}'").to_pylist()
    expected = {"attempt_id": "a1", "group_id": "g1", "task_id": "t1", "split": "train", "status": "ok",
                "n_calls": 2, "n_error_calls": 0, "service_name": "views-harness",
                # the harness's own outcome shows beside the trusted one (a grader's: none here)
                "outcome_reward": None,
                "outcome_rewards_by_source": [("harness", 1.0)]}  # fmt: skip
    assert {key: rollout[key] for key in expected} == expected
    assert rollout["trace_ids"] == [format(root.get_span_context().trace_id, "032x")]
    assert rollout["duration_ms"] > 0

    calls = otel_rl_server.sql(f"SELECT * FROM llm_calls WHERE rollout_id = '{rollout_id}'").to_pylist()
    assert sorted(json.loads(c["input_messages"])[0]["content"] for c in calls) == ["one", "two"]
    assert {(c["group_id"], c["task_id"], c["split"]) for c in calls} == {("g1", "t1", "train")}

    rewards = otel_rl_server.sql(
        f"SELECT * FROM rewards WHERE rollout_id = '{rollout_id}' ORDER BY name"
    ).to_pylist()
    turn_span = format(turn.get_span_context().span_id, "016x")
    root_span = format(root.get_span_context().span_id, "016x")
    got = [(r["name"], r["value"], r["level"], r["origin"], r["source"], r["span_id"]) for r in rewards]
    assert got == [("format", 0.5, "turn", "log", "grader", turn_span),
                   ("outcome", 1.0, "outcome", "span_event", "harness", root_span)]  # fmt: skip


def test_a_zero_code_rollout_from_resource_attributes_with_a_posted_reward(otel_rl_server) -> None:
    rollout_id = uuid.uuid4().hex
    resource = {"service.name": "zero-code-agent"} | identity(rollout_id, **{"task.id": "t2"})
    with telemetry(otel_rl_server, resource) as (tracer_provider, _):
        tracer_provider.get_tracer("opentelemetry.instrumentation.openai.v1").start_span(
            "openai.chat", attributes=chat_attributes("hi")
        ).end()
    posted = httpx.post(
        f"{otel_rl_server.http_url}/v1/rewards",
        json={"rollout_id": rollout_id, "value": 0.25},
        headers=otel_rl_server.auth,
    )
    assert posted.status_code == 200, posted.text

    (rollout,) = otel_rl_server.sql(f"SELECT * FROM rollouts WHERE rollout_id = '{rollout_id}'").to_pylist()
    # no rollout span at all: the ended trace root tells that the harness's work is done
    assert (rollout["task_id"], rollout["status"], rollout["n_calls"]) == ("t2", "ok", 1)
    assert rollout["outcome_reward"] == 0.25
    (reward,) = otel_rl_server.sql(f"SELECT * FROM rewards WHERE rollout_id = '{rollout_id}'").to_pylist()
    assert (reward["level"], reward["origin"], reward["source"], reward["span_id"]) == (
        "outcome",
        "log",
        "grader",
        None,
    )


def test_the_controller_span_gives_the_rollout_status_timeout(otel_rl_server) -> None:
    rollout_id = uuid.uuid4().hex
    ids = identity(rollout_id, **{"attempt.id": "attempt-2"})
    with telemetry(otel_rl_server, {"service.name": "otel-rl-controller"}) as (tracer_provider, _):
        controller = tracer_provider.get_tracer(attr.CONTROLLER_SCOPE)
        with controller.start_as_current_span(attr.ROLLOUT_SPAN_NAME, attributes=ids) as span:
            tracer_provider.get_tracer(attr.SDK_SCOPE).start_span(
                attr.SDK_ROLLOUT_SPAN_NAME, attributes=ids
            ).end()
            span.set_attributes({attr.ROLLOUT_STATUS: "timeout", attr.ROLLOUT_EXIT_CODE: -9})
            span.set_status(Status(StatusCode.ERROR, "timeout"))
    (rollout,) = otel_rl_server.sql(f"SELECT * FROM rollouts WHERE rollout_id = '{rollout_id}'").to_pylist()
    assert (rollout["status"], rollout["exit_code"], rollout["attempt_id"]) == ("timeout", -9, "attempt-2")
    assert (rollout["n_calls"], rollout["outcome_reward"]) == (0, None)


def gateway_attributes(rollout_id: str, prompt: list[int], completion: list[int]) -> dict:
    return chat_attributes("hi") | identity(rollout_id) | {
        "gen_ai.provider.name": "vllm",
        attr.POLICY_VERSION: 3,
        attr.SAMPLING_PARAMS: json.dumps({"temperature": 1.0}),
        attr.PROMPT_TOKEN_IDS: np.asarray(prompt, dtype="<i4").tobytes(),
        attr.CHOICE_TOKEN_IDS.format(i=0): np.asarray(completion, dtype="<i4").tobytes(),
        attr.CHOICE_LOGPROBS.format(i=0): np.asarray([-0.5] * len(completion), dtype="<f4").tobytes(),
    }  # fmt: skip


def test_a_call_recorded_by_the_client_and_the_gateway_is_one_gateway_row(otel_rl_server) -> None:
    propagated, unpropagated = uuid.uuid4().hex, uuid.uuid4().hex
    with (
        telemetry(otel_rl_server, {"service.name": "agent"}) as (client_provider, logger_provider),
        telemetry(otel_rl_server, {"service.name": "otel-rl-gateway"}) as (gateway_provider, _),
    ):
        client = client_provider.get_tracer("opentelemetry.instrumentation.openai.v1")
        gateway = gateway_provider.get_tracer(attr.GATEWAY_SCOPE)
        # with trace propagation: the gateway span is a grandchild of the client's (an HTTP span between)
        with client.start_as_current_span(
            "openai.chat", attributes=chat_attributes("hi") | identity(propagated)
        ) as c:
            with client.start_as_current_span("POST"):
                gateway.start_span(
                    "chat tiny", attributes=gateway_attributes(propagated, [1, 2], [3, 4])
                ).end()
            emit_reward(logger_provider, c, "turn_score", 0.75, "grader")
        # without it: another trace, inside the client call's time range, same rollout
        start = time.time_ns()
        client_span = client.start_span(
            "openai.chat", attributes=chat_attributes("hi") | identity(unpropagated), start_time=start,
            context=trace.set_span_in_context(trace.INVALID_SPAN),
        )  # fmt: skip
        gateway.start_span(
            "chat tiny", attributes=gateway_attributes(unpropagated, [5], [6]), start_time=start + 1000,
            context=trace.set_span_in_context(trace.INVALID_SPAN),
        ).end(end_time=start + 2000)  # fmt: skip
        client_span.end(end_time=start + 3000)

    for rollout_id, prompt, completion in ((propagated, [1, 2], [3, 4]), (unpropagated, [5], [6])):
        (call,) = otel_rl_server.sql(f"SELECT * FROM llm_calls WHERE rollout_id = '{rollout_id}'").to_pylist()
        assert (call["dialect"], call["scope_name"], call["provider"]) == (
            "gateway",
            attr.GATEWAY_SCOPE,
            "vllm",
        )
        assert call["prompt_token_ids"] == prompt
        assert call["completion_token_ids"] == [completion]
        assert call["completion_logprobs"] == [[-0.5] * len(completion)]
        assert (call["policy_version"], json.loads(call["sampling_params"])) == (3, {"temperature": 1.0})
    # the turn reward given to the client's span belongs to the call's (gateway) row
    (reward,) = otel_rl_server.sql(f"SELECT * FROM rewards WHERE rollout_id = '{propagated}'").to_pylist()
    (call_span,) = otel_rl_server.sql(
        f"SELECT span_id FROM llm_calls WHERE rollout_id = '{propagated}'"
    ).column(0)
    assert (reward["level"], reward["span_id"]) == ("turn", call_span.as_py())
