"""`POST /v1/responses` through the gateway in front of a vLLM-style fake: the `openai` client's calls and
Codex CLI's own requests, recorded with the exact tokens the upstream returned."""

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from fake_vllm import MODEL, FakeVLLM, Fault, Reply, ToolCall
from gateway_server import ADMIN_TOKEN, GatewayServer
from test_gateway_responses import parse_events

from otel_rl.gateway import responses

CALC = {
    "type": "function",
    "name": "calc",
    "description": "Evaluates an arithmetic expression.",
    "parameters": {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
}


def calculator(request: dict, index: int) -> Reply | str:
    """The fake model: a tool call for a question, an answer once the tool's result is in (Codex's shell
    tool and "Done." when the tools are Codex's)."""
    last = request["messages"][-1]
    codex = any(tool["function"]["name"] == "exec_command" for tool in request.get("tools") or ())
    if last["role"] == "tool":
        return "Done." if codex else f"The answer is {last['content']}."
    if codex:
        return Reply(tool_calls=(ToolCall("exec_command", {"cmd": "echo hello > out.txt"}),))
    if request.get("tools"):
        return Reply(tool_calls=(ToolCall("calc", {"expression": "37 + 48"}),))
    return "Hello from the fake."


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeVLLM]:
    with FakeVLLM(calculator) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(fake: FakeVLLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    with GatewayServer(tmp_path_factory.mktemp("gateway") / "store.duckdb", vllm=[fake.base_url]) as server:
        yield server


def responses_client(gateway: GatewayServer, *, key: str = ADMIN_TOKEN) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0)


def new_rollout() -> str:
    return f"rollout-{uuid.uuid4().hex[:12]}"


def fake_chat(fake: FakeVLLM, chat: dict) -> dict:
    """What the fake answers a chat request directly, with every token id and logprob."""
    body = chat | {"stream": False, "logprobs": True, "return_token_ids": True}
    body.pop("stream_options", None)
    return httpx.post(f"{fake.url}/chat/completions", json=body, timeout=10).json()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_function_call_round_trip_through_the_gateway_records_each_turns_exact_tokens(gateway, fake, stream):
    rollout = new_rollout()
    client = responses_client(gateway, key=gateway.rollout_key(rollout))
    first_request = {"model": MODEL, "instructions": "You are a calculator.", "input": "What is 37 + 48?",
                     "tools": [CALC], "store": False}  # fmt: skip

    def create(request: dict):
        if not stream:
            return client.responses.create(**request)
        with client.responses.stream(**request) as events:
            kinds = [event.type for event in events]
            assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
            return events.get_final_response()

    first = create(first_request)
    [call] = first.output
    assert (call.type, call.name, json.loads(call.arguments)) == (
        "function_call",
        "calc",
        {"expression": "37 + 48"},
    )
    assert (
        first.status == "completed"
        and first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens
    )
    # Codex sends the whole conversation back: the call as it came, and the tool's output
    second_request = first_request | {"input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is 37 + 48?"}]},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "85"},
    ]}  # fmt: skip
    second = create(second_request)
    assert second.output_text == "The answer is 85."

    spans = gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{rollout}'", expect=2)
    assert len(spans) == 2
    for span, request in zip(spans, (first_request, second_request), strict=True):
        direct = fake_chat(fake, responses.chat_request(request))
        assert span["prompt_token_ids"] == direct["prompt_token_ids"]
        assert span["choice_token_ids"] == [direct["choices"][0]["token_ids"]]
        assert span["choice_logprobs"] == [
            [entry["logprob"] for entry in direct["choices"][0]["logprobs"]["content"]]
        ]
        attributes = span["attributes"]
        assert attributes["otel_rl.gateway.api"] == "responses"
        assert attributes["gen_ai.operation.name"] == "chat" and attributes["gen_ai.request.stream"] is stream
    # what the model saw on the second turn: the tool call in the assistant turn, then the tool's result
    messages = json.loads(spans[1]["attributes"]["gen_ai.input.messages"])
    assert [message["role"] for message in messages] == ["system", "user", "assistant", "tool"]
    assert messages[2]["parts"] == [
        {"type": "tool_call", "id": call.call_id, "name": "calc", "arguments": {"expression": "37 + 48"}}
    ]
    assert messages[3]["parts"] == [{"type": "tool_call_response", "id": call.call_id, "response": "85"}]


def test_the_client_gets_no_token_ids_or_logprobs_it_did_not_include(gateway, fake):
    raw = responses_client(gateway).responses.with_raw_response.create(model=MODEL, input="Hi")
    body = json.loads(raw.text)
    assert "token_ids" not in raw.text and "prompt_token_ids" not in raw.text
    assert body["output"][0]["content"][0] == {
        "type": "output_text", "text": "Hello from the fake.", "annotations": [], "logprobs": []
    }  # fmt: skip
    included = responses_client(gateway).responses.create(
        model=MODEL, input="Hi", include=["message.output_text.logprobs"]
    )
    direct = fake_chat(fake, responses.chat_request({"model": MODEL, "input": "Hi"}))
    logprobs = [entry.logprob for entry in included.output[0].content[0].logprobs]
    assert logprobs == [entry["logprob"] for entry in direct["choices"][0]["logprobs"]["content"]]


def test_bad_requests_get_openais_error_shape_and_no_span(gateway):
    rollout = new_rollout()
    client = responses_client(gateway, key=gateway.rollout_key(rollout))
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input="Hi", previous_response_id="resp_1")
    assert refused.value.body["message"].startswith("`previous_response_id` is not supported")
    assert (refused.value.body["type"], refused.value.body["code"]) == ("BadRequestError", None)
    with pytest.raises(openai.BadRequestError, match=re.escape('`input[0].type` "item_reference"')):
        client.responses.create(model=MODEL, input=[{"type": "item_reference", "id": "msg_1"}])
    with pytest.raises(openai.AuthenticationError) as unauthorized:
        responses_client(gateway, key="not-a-key").responses.create(model=MODEL, input="Hi")
    assert set(unauthorized.value.body) == {"message", "type", "param", "code"}
    not_json = httpx.post(f"{gateway.url}/responses", content=b"{", headers=gateway.admin, timeout=10)
    assert not_json.status_code == 400 and set(not_json.json()["error"]) == {
        "message",
        "type",
        "param",
        "code",
    }
    assert gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{rollout}'", expect=0, timeout_s=0.5) == []


def test_vllms_error_reaches_the_client_in_openais_shape(gateway, fake):
    fake.inject(Fault(status=400, message="This model's maximum context length is 32 tokens"))
    with pytest.raises(openai.BadRequestError) as refused:
        responses_client(gateway).responses.create(model=MODEL, input="Hi")
    assert refused.value.body["message"] == "This model's maximum context length is 32 tokens"


def test_upstream_dropping_the_stream_ends_it_with_response_failed(gateway, fake):
    rollout = new_rollout()
    fake.inject(Fault(disconnect_after_chunks=3))
    client = responses_client(gateway, key=gateway.rollout_key(rollout))
    events = list(client.responses.create(model=MODEL, input="Hi", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.failed"
    assert events[-1].response.error.code == "server_error"
    [span] = gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{rollout}'")
    assert span["attributes"]["error.type"] == "upstream_disconnected"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_reasoning_comes_out_as_a_reasoning_item_and_goes_back_in_as_the_turns_reasoning(
    gateway, fake, stream
):
    rollout = new_rollout()
    client = responses_client(gateway, key=gateway.rollout_key(rollout))
    fake.script(lambda request, index: Reply(content="85.", reasoning="37 + 48 is 85"))
    try:
        if stream:
            with client.responses.stream(model=MODEL, input="What is 37 + 48?") as events:
                deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
                first = events.get_final_response()
            assert "".join(deltas) == "37 + 48 is 85"
        else:
            first = client.responses.create(model=MODEL, input="What is 37 + 48?")
        reasoning, message = first.output
        assert (reasoning.type, reasoning.content[0].text) == ("reasoning", "37 + 48 is 85")
        assert (message.type, first.output_text) == ("message", "85.")
        replay = [{"role": "user", "content": "What is 37 + 48?"}]
        replay += [item.model_dump(exclude_none=True) for item in first.output]
        client.responses.create(model=MODEL, input=replay + [{"role": "user", "content": "And 1 + 1?"}])
    finally:
        fake.script(calculator)
    spans = gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{rollout}'", expect=2)
    assistant = json.loads(spans[1]["attributes"]["gen_ai.input.messages"])[1]
    assert assistant == {
        "role": "assistant",
        "parts": [{"type": "reasoning", "content": "37 + 48 is 85"}, {"type": "text", "content": "85."}],
    }


CODEX_CAPTURES = Path(__file__).parent / "captures" / "responses" / "codex-0.171.0"


@pytest.mark.parametrize("turn", ["turn1.json", "turn2.json"])
def test_codex_0171s_own_requests_stream_back_what_codex_reads(gateway, fake, turn):
    """Codex's requests as it sent them (tests/captures/responses/capture_codex.py): tools of its own kinds,
    developer messages, its shell call and output, client metadata; answered with the events Codex parses."""
    raw = (CODEX_CAPTURES / turn).read_bytes()
    headers = {**gateway.admin, "content-type": "application/json"}
    with httpx.stream(
        "POST", f"{gateway.url}/responses", content=raw, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200, response.read()
        events = parse_events(response.read())
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    [item] = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert events[-1]["response"]["output"] == [item]
    if turn == "turn1.json":
        assert (item["type"], item["name"]) == ("function_call", "exec_command")
        assert json.loads(item["arguments"]) == {"cmd": "echo hello > out.txt"}
    else:
        assert (item["type"], item["content"][0]["text"]) == ("message", "Done.")
    usage = events[-1]["response"]["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0
    sent = fake.requests[-1].body  # what vLLM received for it
    request = json.loads(raw)
    assert [m["role"] for m in sent["messages"][:4]] == ["developer", "developer", "user", "user"]
    names = [tool["function"]["name"] for tool in sent["tools"]]
    assert "multi_agent_v1__close_agent" in names and "exec_command" in names  # namespaces flattened
    assert len(names) == sum(
        len(t["tools"]) if t["type"] == "namespace" else t["type"] == "function" for t in request["tools"]
    )  # the hosted web_search tool is dropped
    assert sent["parallel_tool_calls"] is request["parallel_tool_calls"]
