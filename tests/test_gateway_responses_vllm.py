"""`POST /v1/responses` through the gateway in front of a real vLLM: the content vLLM's own `/v1/responses`
gives, the exact tokens vLLM rendered and sampled, and no failed stream across a weight reload."""

import asyncio
import json
import time
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest
from gateway_server import GatewayServer, policy_version, set_policy_now

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
# Forces the tiny (untrained) model to write one Hermes tool call, which vLLM's tool parser then parses.
TOOL_CALL_TEXT = '<tool_call>{"name": "calc", "arguments": {"expression": "37 + 48"}}</tool_call>'
TOOL_CALL_REGEX = TOOL_CALL_TEXT.replace("{", r"\{").replace("}", r"\}").replace("+", r"\+")
REQUESTS = {
    "instructions": {"instructions": "You are a calculator agent.", "input": "What is 37 + 48?"},
    "tool call": {
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "37 + 48?"}]}
        ],
        "tools": [CALC],
        "structured_outputs": {"regex": TOOL_CALL_REGEX},
        "max_output_tokens": 60,
    },
    "tool output": {
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "Be brief."}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "What is 37 + 48?"}],
            },
            {
                "type": "function_call",
                "name": "calc",
                "arguments": '{"expression": "37 + 48"}',
                "call_id": "c1",
            },
            {"type": "function_call_output", "call_id": "c1", "output": "85"},
        ],
        "tools": [CALC],
    },
}


@pytest.fixture(scope="module")
def gateway(vllm_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    with GatewayServer(tmp_path_factory.mktemp("gateway") / "store.duckdb", vllm=[vllm_server.url]) as server:
        yield server


def greedy(name: str) -> dict:
    return {"model": "tiny", "temperature": 0, "max_output_tokens": 12} | REQUESTS[name]


def vllm_responses(vllm_server, request: dict) -> dict:
    """vLLM's own `/v1/responses`, with the raw prompt and output tokens it shows (for any model)."""
    body = request | {"enable_response_messages": True}
    return httpx.post(f"{vllm_server.url}/v1/responses", json=body, timeout=60).raise_for_status().json()


def vllm_responses_stream(vllm_server, request: dict) -> list[dict]:
    body = request | {"stream": True}
    with httpx.stream("POST", f"{vllm_server.url}/v1/responses", json=body, timeout=60) as response:
        text = response.raise_for_status().read().decode()
    return [json.loads(block.split("data: ", 1)[1]) for block in text.split("\n\n") if "data: " in block]


def content(response: dict) -> dict:
    """What a client reads in a response: status, usage counts, and each item's type, text, name and
    arguments (ids are random on both sides)."""
    items = []
    for item in response["output"]:
        kept = {k: item.get(k) for k in ("type", "role", "status", "name", "arguments", "namespace")}
        kept["content"] = [(part["type"], part["text"]) for part in item.get("content") or ()]
        items.append(kept)
    usage = response["usage"]
    return {
        "status": response["status"],
        "incomplete_details": response["incomplete_details"],
        "usage": (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]),
        "output": items,
    }


def kinds(events: list[dict]) -> list[str]:
    """The events' types, a run of deltas of one kind counted as one."""
    collapsed: list[str] = []
    for event in events:
        if not (event["type"].endswith(".delta") and collapsed and collapsed[-1] == event["type"]):
            collapsed.append(event["type"])
    return collapsed


def client(gateway: GatewayServer, rollout_id: str) -> openai.OpenAI:
    key = gateway.rollout_key(rollout_id)
    return openai.OpenAI(base_url=gateway.url, api_key=key, max_retries=0)


def new_rollout() -> str:
    return f"rollout-{uuid.uuid4().hex[:12]}"


@pytest.mark.parametrize("name", list(REQUESTS))
def test_whole_response_is_vllms_own_and_the_span_has_the_tokens_vllm_rendered(gateway, vllm_server, name):
    request, rollout = greedy(name), new_rollout()
    own = vllm_responses(vllm_server, request)
    if name == "tool call":
        assert own["output"][0]["type"] == "function_call", "vLLM did not parse the forced tool call"

    extra = {"structured_outputs": request["structured_outputs"]} if "structured_outputs" in request else {}
    plain = {k: v for k, v in request.items() if k != "structured_outputs"}
    received = client(gateway, rollout).responses.create(**plain, extra_body=extra or None)

    assert content(received.model_dump()) == content(own)
    [span] = gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{rollout}'")
    # the prompt the model consumed is the one vLLM's own /v1/responses renders for the same request
    assert span["prompt_token_ids"] == own["input_messages"][0]["tokens"]
    assert span["choice_token_ids"] == [own["output_messages"][0]["tokens"]]
    assert len(span["choice_logprobs"][0]) == len(span["choice_token_ids"][0])  # tool-call turns included
    assert span["attributes"]["otel_rl.gateway.api"] == "responses"
    assert span["attributes"]["otel_rl.rollout.id"] == rollout


def test_a_tool_call_turn_has_its_logprobs_recorded_where_vllms_own_endpoint_has_none(gateway, vllm_server):
    """Why the gateway sends vLLM chat requests: vLLM's `/v1/responses` puts logprobs on output text only, so
    a turn of tool calls (an agent's usual turn) has none; the trainer needs every sampled token's."""
    request, rollout = greedy("tool call") | {"include": ["message.output_text.logprobs"]}, new_rollout()
    own = vllm_responses(vllm_server, request)
    assert [item["type"] for item in own["output"]] == ["function_call"]
    assert "logprobs" not in json.dumps(own["output"])

    plain = {k: v for k, v in request.items() if k != "structured_outputs"}
    client(gateway, rollout).responses.create(
        **plain, extra_body={"structured_outputs": request["structured_outputs"]}
    )
    [span] = gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{rollout}'")
    assert span["choice_token_ids"] == [own["output_messages"][0]["tokens"]]
    assert len(span["choice_logprobs"][0]) == len(span["choice_token_ids"][0]) > 0


@pytest.mark.parametrize("name", list(REQUESTS))
def test_stream_is_vllms_own_event_for_event(gateway, vllm_server, name):
    request, rollout = greedy(name), new_rollout()
    own = vllm_responses_stream(vllm_server, request)
    tokens = vllm_responses(vllm_server, request)

    extra = {"structured_outputs": request["structured_outputs"]} if "structured_outputs" in request else {}
    plain = {k: v for k, v in request.items() if k != "structured_outputs"}
    events = [
        e.model_dump()
        for e in client(gateway, rollout).responses.create(**plain, stream=True, extra_body=extra or None)
    ]

    # vLLM merges the deltas of tokens decoded while its stream waited: compare runs of deltas, and their text
    assert kinds(events) == kinds(own)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for kind in ("response.output_text.delta", "response.function_call_arguments.delta"):
        assert "".join(e["delta"] for e in events if e["type"] == kind) == "".join(
            e["delta"] for e in own if e["type"] == kind
        )
    assert content(events[-1]["response"]) == content(own[-1]["response"])
    [span] = gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{rollout}'")
    assert span["prompt_token_ids"] == tokens["input_messages"][0]["tokens"]
    assert span["choice_token_ids"] == [tokens["output_messages"][0]["tokens"]]


# Near the tiny model's 1024 positions: on a fast machine 400 tokens ended before the reload's pause
LONG_STREAM = 960


def test_a_reload_in_the_middle_of_responses_streams_fails_none_of_them(gateway, tiny_model_dir):
    async def stream(n: int, prefix: str) -> list:
        key = await asyncio.to_thread(gateway.rollout_key, f"{prefix}-{n}")
        async with openai.AsyncOpenAI(base_url=gateway.url, api_key=key, max_retries=0) as client:
            events = await client.responses.create(
                model="tiny", input=f"Count to {n}.", max_output_tokens=LONG_STREAM, stream=True,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            received = []
            async for event in events:  # a client slower than vLLM always has an event ready: without a
                received.append(event)  # yield per event, the loop ran no other task (the reload's post)
                await asyncio.sleep(0)  # until the streams had ended
            return received

    async def scenario(prefix: str, version: int) -> tuple[list, httpx.Response]:
        streams = asyncio.gather(*(stream(n, prefix) for n in range(4)))
        deadline = time.monotonic() + 60
        while gateway.gateway.coordinator.in_flight < 2 and not streams.done():  # streams are generating
            assert time.monotonic() < deadline, "the streams never got going"
            await asyncio.sleep(0.005)
        if streams.done() and streams.exception() is not None:
            raise streams.exception()  # a stream failed before the reload: say how
        # the same weights: the session's server keeps its base model; what matters is the pause and drain
        reloaded = await set_policy_now(gateway, version, checkpoint=tiny_model_dir)
        return await streams, reloaded

    version = policy_version(gateway)
    for _ in range(10):  # the streams may end before the pause (on a loaded or fast machine): no proof
        prefix = f"reload-stream-{uuid.uuid4().hex[:8]}"
        version += 1
        results, reloaded = asyncio.run(scenario(prefix, version))
        assert reloaded.status_code == 200, reloaded.text
        if reloaded.json()["in_flight_at_pause"] >= 1:
            break
    report = reloaded.json()
    assert report["in_flight_at_pause"] >= 1 and report["aborted"] == 0, report
    for events in results:
        assert events[-1].type == "response.completed"
        assert events[-1].response.usage.output_tokens == LONG_STREAM
    spans = gateway.spans(f"attributes->>'otel_rl.rollout.id' LIKE '{prefix}-%'", expect=4)
    assert all(s["status_code"] != 2 for s in spans)
    # the streams in flight at the pause finished under the version they started with
    assert {s["attributes"]["otel_rl.policy.version"] for s in spans} <= {version - 1, version}
    assert version - 1 in {s["attributes"]["otel_rl.policy.version"] for s in spans}
