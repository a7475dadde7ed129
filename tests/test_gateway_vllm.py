"""The gateway in front of a real vLLM server: what the client receives, and what each call's span records."""

import json
import uuid
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
from gateway_server import ADMIN_TOKEN, GatewayServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from otel_rl.tinymodel import CALC_TOOL

MESSAGES = [
    {"role": "system", "content": "You are a calculator agent."},
    {"role": "user", "content": "What is 37 + 48?"},
]
# Forces the tiny (untrained) model to write one Hermes tool call, which vLLM's tool parser then parses.
TOOL_CALL_TEXT = '<tool_call>{"name": "calc", "arguments": {"expression": "37 + 48"}}</tool_call>'
TOOL_CALL_REGEX = TOOL_CALL_TEXT.replace("{", r"\{").replace("}", r"\}").replace("+", r"\+")


ASK_ALL = {"logprobs": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def gateway(vllm_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    with GatewayServer(tmp_path_factory.mktemp("gateway") / "store.duckdb", vllm=[vllm_server.url]) as server:
        yield server


def new_rollout() -> str:
    return f"rollout-{uuid.uuid4().hex[:12]}"


def client(gateway: GatewayServer, rollout_id: str | None = None, key: str = ADMIN_TOKEN) -> openai.OpenAI:
    headers = {"x-otel-rl-rollout-id": rollout_id} if rollout_id else None
    return openai.OpenAI(base_url=gateway.url, api_key=key, default_headers=headers, max_retries=0)


def vllm_post(server, path: str, body: dict) -> dict:
    response = httpx.post(f"{server.url}{path}", json=body, timeout=60)
    response.raise_for_status()
    return response.json()


def without_ids(response: dict) -> dict:
    """A response without what differs between two identical calls."""
    return {k: v for k, v in response.items() if k not in ("id", "created")}


def chat_logprobs(choice: dict) -> list[float]:
    return float32([entry["logprob"] for entry in choice["logprobs"]["content"]])


def float32(values: list[float]) -> list[float]:
    return np.asarray(values, dtype=np.float32).tolist()


def test_chat_call_gives_the_client_what_it_asked_and_records_vllms_tokens_and_logprobs(gateway, vllm_server):
    rollout = new_rollout()
    body = {"model": "tiny", "messages": MESSAGES, "temperature": 0, "max_tokens": 12}
    plain = vllm_post(vllm_server, "/v1/chat/completions", body)
    full = vllm_post(vllm_server, "/v1/chat/completions", {**body, **ASK_ALL})

    received = client(gateway, rollout).chat.completions.create(**body).model_dump(exclude_unset=True)

    assert without_ids(received) == without_ids(plain)  # no token ids or logprobs: the client asked for none
    [span] = gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{rollout}'")
    assert span["prompt_token_ids"] == full["prompt_token_ids"]
    assert span["choice_token_ids"] == [full["choices"][0]["token_ids"]]
    assert span["choice_logprobs"] == [chat_logprobs(full["choices"][0])]
    assert (span["name"], span["kind"], span["status_code"]) == ("chat tiny", 3, 0)
    attributes = span["attributes"]
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "tiny"
    assert attributes["gen_ai.response.id"] == received["id"]
    assert json.loads(attributes["gen_ai.input.messages"]) == [
        {"role": "system", "parts": [{"type": "text", "content": MESSAGES[0]["content"]}]},
        {"role": "user", "parts": [{"type": "text", "content": MESSAGES[1]["content"]}]},
    ]
    content = received["choices"][0]["message"]["content"]
    finish = received["choices"][0]["finish_reason"]
    assert json.loads(attributes["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": content}], "finish_reason": finish}
    ]
    assert attributes["gen_ai.response.finish_reasons"] == [finish]
    # usage has its prompt details (Traceloop's instrumentation raises on vLLM's default null there)
    cached = received["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert attributes["gen_ai.usage.cache_read.input_tokens"] == cached >= 0
    assert attributes["gen_ai.usage.input_tokens"] == len(full["prompt_token_ids"])
    assert attributes["gen_ai.usage.output_tokens"] == len(full["choices"][0]["token_ids"])
    assert attributes["otel_rl.policy.version"] == 0
    assert attributes["otel_rl.server.url"] == vllm_server.url
    sent = {"temperature": 0, "max_tokens": 12, "logprobs": True}
    assert json.loads(attributes["otel_rl.sampling.params"]) == sent


def test_completions_call_records_vllms_tokens_and_logprobs(gateway, vllm_server):
    rollout = new_rollout()
    body = {"model": "tiny", "prompt": "37 + 48 =", "temperature": 0, "max_tokens": 10}
    full = vllm_post(vllm_server, "/v1/completions", {**body, "logprobs": 0, "return_token_ids": True})

    received = client(gateway, rollout).completions.create(**body)

    assert received.choices[0].text == full["choices"][0]["text"]
    assert received.choices[0].logprobs is None
    [span] = gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{rollout}'")
    assert span["name"] == "text_completion tiny"
    assert span["prompt_token_ids"] == full["choices"][0]["prompt_token_ids"]
    assert span["choice_token_ids"] == [full["choices"][0]["token_ids"]]
    assert span["choice_logprobs"] == [float32(full["choices"][0]["logprobs"]["token_logprobs"])]
    assert json.loads(span["attributes"]["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "37 + 48 ="}]}
    ]


def test_streamed_chat_is_relayed_chunk_by_chunk_and_its_tokens_assembled(gateway, vllm_server):
    rollout = new_rollout()
    body = {"model": "tiny", "messages": MESSAGES, "temperature": 0, "max_tokens": 12}
    full = vllm_post(vllm_server, "/v1/chat/completions", {**body, **ASK_ALL})

    chunks = list(client(gateway, rollout).chat.completions.create(**body, stream=True))

    assert len(chunks) > 3  # relayed chunk by chunk, not as one response
    content = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert content == full["choices"][0]["message"]["content"]
    assert all(getattr(c.choices[0], "token_ids", None) is None for c in chunks if c.choices)
    [span] = gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{rollout}'")
    assert span["prompt_token_ids"] == full["prompt_token_ids"]
    assert span["choice_token_ids"] == [full["choices"][0]["token_ids"]]
    assert span["choice_logprobs"] == [chat_logprobs(full["choices"][0])]
    attributes = span["attributes"]
    assert attributes["gen_ai.request.stream"] is True
    assert attributes["gen_ai.response.time_to_first_chunk"] > 0
    assert attributes["gen_ai.response.finish_reasons"] == [full["choices"][0]["finish_reason"]]


def test_train_rollout_with_n_2_records_every_choice_and_the_trainers_sampling(gateway):
    rollout = new_rollout()
    key = gateway.rollout_key(rollout, split="train", group_id="g1", task_id="t1", attempt_id="a1")
    received = client(gateway, key=key).chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        n=2,
        max_tokens=10,
        temperature=0.3,  # the train split forces temperature 1.0, top_p 1.0 (the trainer's assumption)
        seed=11,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )

    [span] = gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{rollout}'")
    choices = received.choices
    assert span["choice_token_ids"] == [choice.token_ids for choice in choices]
    assert span["choice_logprobs"] == [float32([e.logprob for e in c.logprobs.content]) for c in choices]
    assert span["prompt_token_ids"] == received.prompt_token_ids
    attributes = span["attributes"]
    assert json.loads(attributes["otel_rl.sampling.params"]) == {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_tokens": 10,
        "n": 2,
        "seed": 11,
        "logprobs": True,
    }
    assert attributes["gen_ai.request.temperature"] == 1.0
    assert attributes["gen_ai.request.choice.count"] == 2
    assert len(json.loads(attributes["gen_ai.output.messages"])) == 2
    assert {k: attributes[f"otel_rl.{k}"] for k in ("split", "group.id", "task.id", "attempt.id")} == {
        "split": "train",
        "group.id": "g1",
        "task.id": "t1",
        "attempt.id": "a1",
    }


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_call_is_passed_through_and_recorded_as_a_tool_call_part(gateway, vllm_server, stream):
    rollout = new_rollout()
    body = {
        "model": "tiny",
        "messages": MESSAGES,
        "tools": [CALC_TOOL],
        "temperature": 0,
        "max_tokens": 40,
    }
    forced = {"structured_outputs": {"regex": TOOL_CALL_REGEX}}
    full = vllm_post(vllm_server, "/v1/chat/completions", {**body, **forced, **ASK_ALL})
    assert full["choices"][0]["message"]["tool_calls"], "vLLM did not parse the forced tool call"

    call = client(gateway, rollout).chat.completions.create(**body, stream=stream, extra_body=forced)
    if stream:
        deltas = [d for chunk in call if chunk.choices for d in chunk.choices[0].delta.tool_calls or ()]
        name = "".join(d.function.name or "" for d in deltas)
        arguments = "".join(d.function.arguments or "" for d in deltas)
    else:
        [tool_call] = call.choices[0].message.tool_calls
        name, arguments = tool_call.function.name, tool_call.function.arguments

    assert (name, json.loads(arguments)) == ("calc", {"expression": "37 + 48"})
    [span] = gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{rollout}'")
    assert span["choice_token_ids"] == [full["choices"][0]["token_ids"]]
    [message] = json.loads(span["attributes"]["gen_ai.output.messages"])
    [part] = [part for part in message["parts"] if part["type"] == "tool_call"]
    assert (part["name"], part["arguments"]) == ("calc", {"expression": "37 + 48"})
    assert message["finish_reason"] == "tool_calls"
    assert json.loads(span["attributes"]["gen_ai.tool.definitions"]) == [CALC_TOOL]


def test_span_is_the_child_of_the_callers_traceparent(gateway):
    trace_id, parent_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    traceparent = f"00-{trace_id}-{parent_id}-00"  # not sampled by the caller: recorded all the same
    client(gateway).chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=2, extra_headers={"traceparent": traceparent}
    )
    [span] = gateway.spans(f"trace_id = '{trace_id}'")
    assert span["parent_span_id"] == parent_id


def test_rollout_identity_from_baggage(gateway):
    rollout = new_rollout()
    baggage = f"otel_rl.rollout.id={rollout},otel_rl.split=val,otel_rl.group.id=g7"
    client(gateway).chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=2, temperature=0.5, extra_headers={"baggage": baggage}
    )
    [span] = gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{rollout}'")
    assert (span["attributes"]["otel_rl.split"], span["attributes"]["otel_rl.group.id"]) == ("val", "g7")
    assert span["attributes"]["gen_ai.request.temperature"] == 0.5  # val: the client's sampling is kept


def test_rollout_key_reaches_models_for_its_own_rollout_only(gateway):
    rollout, other = new_rollout(), new_rollout()
    key = gateway.rollout_key(rollout)
    own = client(gateway, key=key)
    own.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    [span] = gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{rollout}'")
    assert span["attributes"]["otel_rl.rollout.id"] == rollout

    call = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2}
    with pytest.raises(openai.PermissionDeniedError, match=f"this key is for rollout '{rollout}'"):
        client(gateway, other, key=key).chat.completions.create(**call)
    with pytest.raises(openai.AuthenticationError):
        client(gateway, key="not-a-key").chat.completions.create(**call)
    as_key = {"authorization": f"Bearer {key}"}
    for method, path in [
        ("POST", "/v1/admin/policy"),
        ("GET", "/v1/admin/policy"),
        ("POST", f"/v1/admin/rollouts/{rollout}/key"),
        ("POST", "/v1/query"),
    ]:
        body = {"version": 1, "checkpoint": "/tmp"} if path == "/v1/admin/policy" else {"sql": "SELECT 1"}
        response = httpx.request(method, gateway.base_url + path, json=body, headers=as_key, timeout=10)
        assert response.status_code == 403, (path, response.text)
    report = httpx.post(
        f"{gateway.base_url}/v1/traces",
        content=otlp_span_of(other).SerializeToString(),
        headers={**as_key, "content-type": "application/x-protobuf"},
        timeout=10,
    )
    rejected = ExportTraceServiceResponse.FromString(report.content).partial_success  # OTLP partial success
    assert (report.status_code, rejected.rejected_spans) == (200, 1)
    assert "another rollout" in rejected.error_message
    stored = gateway.query(f"SELECT * FROM spans WHERE attributes->>'otel_rl.rollout.id' = '{other}'")
    assert stored.num_rows == 0


def otlp_span_of(rollout_id: str) -> ExportTraceServiceRequest:
    span = Span(
        trace_id=uuid.uuid4().bytes,
        span_id=uuid.uuid4().bytes[:8],
        name="agent step",
        attributes=[KeyValue(key="otel_rl.rollout.id", value=AnyValue(string_value=rollout_id))],
    )
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])])


def test_models_lists_the_servers_models(gateway):
    assert [model.id for model in client(gateway).models.list()] == ["tiny"]


def test_policy_endpoint_reports_the_version_and_servers(gateway, vllm_server):
    policy = httpx.get(f"{gateway.base_url}/v1/admin/policy", headers=gateway.admin, timeout=10).json()
    assert policy["version"] == 0
    [server] = policy["servers"]
    assert server == {"url": vllm_server.url, "available": True, "healthy": True, "out_reason": None}
