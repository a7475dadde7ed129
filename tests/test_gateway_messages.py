"""Anthropic Messages through the gateway (`otel-rl serve`), with the official `anthropic` client: in front of
the vLLM-style fake, and in front of real vLLM, where every answer equals vLLM's own `/v1/messages`."""

import asyncio
import json
import re
import sys
import time
import uuid
from collections.abc import Iterator
from types import ModuleType

import httpx
import pytest
from fake_vllm import FakeVLLM, Fault, Reply, ToolCall, render_chat, tokenize
from gateway_server import ADMIN_TOKEN, GatewayServer, policy_version, set_policy, set_policy_now
from otel_rl_server import ServerProcess
from test_sdk import installed_on_its_own

from otel_rl.gateway import messages
from otel_rl.tinymodel import CALC_TOOL, init_model

ANTHROPIC = ["anthropic==2.10.0", "docstring-parser==0.18.0"]  # its dependencies not in our environment
SYSTEM = "You are a calculator agent."
QUESTION = "What is 37 + 48?"
CALC = {
    "name": "calc",
    "description": CALC_TOOL["function"]["description"],
    "input_schema": CALC_TOOL["function"]["parameters"],
}


@pytest.fixture(scope="module")
def anthropic() -> ModuleType:
    """The official client, pinned, installed once into a cached folder outside the checkout."""
    sys.path.insert(0, str(installed_on_its_own(ANTHROPIC)))
    import anthropic

    return anthropic


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeVLLM]:
    with FakeVLLM() as server:
        yield server


@pytest.fixture(scope="module")
def served(fake: FakeVLLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`otel-rl serve --vllm <fake>`: the real server process on loopback."""
    workdir = tmp_path_factory.mktemp("messages")
    server = ServerProcess(workdir / "otel_rl.duckdb", workdir, flags=("--vllm", fake.base_url)).start()
    yield server
    server.stop()


def rollout_key(server: ServerProcess, rollout_id: str, **identity: str) -> str:
    url = f"{server.http_url}/v1/admin/rollouts/{rollout_id}/key"
    response = httpx.post(url, json=identity, headers=server.auth, timeout=10)
    response.raise_for_status()
    return response.json()["key"]


def call_span(server: ServerProcess, rollout_id: str, timeout_s: float = 10) -> dict:
    """The one gateway span of a rollout: its attributes and its recorded token ids."""
    sql = f"""SELECT s.attributes, s.content_attributes, t.prompt_token_ids, t.choice_token_ids
              FROM spans s JOIN call_tokens t USING (trace_id, span_id)
              WHERE s.scope_name = 'otel_rl.gateway'
                AND s.attributes->>'otel_rl.rollout.id' = '{rollout_id}'"""
    deadline = time.monotonic() + timeout_s
    while not (rows := server.sql(sql).to_pylist()) and time.monotonic() < deadline:
        time.sleep(0.05)
    [row] = rows
    attributes = json.loads(row["attributes"]) | json.loads(row["content_attributes"] or "{}")
    return {
        "attributes": attributes,
        "prompt": row["prompt_token_ids"],
        "completion": row["choice_token_ids"],
    }


def new_rollout() -> str:
    return f"messages-{uuid.uuid4().hex[:12]}"


# ------------------------------------------------------------------ in front of the fake


def test_call_with_a_rollout_key_in_x_api_key_is_answered_as_a_message_and_recorded(anthropic, fake, served):
    fake.script(["The answer is 85."])
    rollout = new_rollout()
    key = rollout_key(served, rollout, group_id="g1", split="val")
    client = anthropic.Anthropic(base_url=served.http_url, api_key=key, max_retries=0)  # sends x-api-key

    message = client.messages.create(
        model="fake-model", max_tokens=64, system=[{"type": "text", "text": SYSTEM}],
        messages=[{"role": "user", "content": QUESTION}], metadata={"user_id": "ignored"},
    )  # fmt: skip

    assert [(block.type, block.text) for block in message.content] == [("text", "The answer is 85.")]
    assert (message.role, message.stop_reason, message.stop_sequence) == ("assistant", "end_turn", None)
    chat_messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    prompt = tokenize(render_chat(chat_messages))
    assert (message.usage.input_tokens, message.usage.output_tokens) == (
        len(prompt),
        len("The answer is 85."),
    )
    span = call_span(served, rollout)
    attributes = span["attributes"]
    assert (attributes["otel_rl.gateway.api"], attributes["gen_ai.operation.name"]) == ("messages", "chat")
    assert (attributes["otel_rl.group.id"], attributes["otel_rl.split"]) == ("g1", "val")
    assert span["prompt"] == prompt  # the chat call vLLM rendered, token for token
    assert span["completion"] == [tokenize("The answer is 85.")]
    assert json.loads(attributes["gen_ai.input.messages"])[0] == {
        "role": "system", "parts": [{"type": "text", "content": SYSTEM}]
    }  # fmt: skip
    sent = fake.requests[-1].body
    assert (sent["max_tokens"], sent["logprobs"], sent["return_token_ids"]) == (64, True, True)


def test_stream_sends_anthropics_events_and_the_span_assembles_vllms_chunks(anthropic, fake, served):
    fake.script(["Two plus two is four."])
    rollout = new_rollout()
    client = anthropic.Anthropic(
        base_url=served.http_url, api_key=rollout_key(served, rollout), max_retries=0
    )
    with client.messages.stream(
        model="fake-model", max_tokens=64, messages=[{"role": "user", "content": "2+2?"}]
    ) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()

    assert events[0] == "message_start" and events[-1] == "message_stop"
    # the SDK follows each text_delta with a `text` event of its own
    assert events[1:4] == ["content_block_start", "content_block_delta", "text"]
    assert "message_delta" in events and events.count("content_block_stop") == 1
    assert [(block.type, block.text) for block in final.content] == [("text", "Two plus two is four.")]
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == len("Two plus two is four.")
    span = call_span(served, rollout)
    assert span["completion"] == [tokenize("Two plus two is four.")]
    assert span["attributes"]["gen_ai.request.stream"] is True


def test_raw_stream_has_a_ping_after_message_start_and_beta_query_is_served(fake, served):
    fake.script(["Hi."])
    body = {
        "model": "fake-model",
        "max_tokens": 8,
        "stream": True,
        "messages": [{"role": "user", "content": "x"}],
    }
    response = httpx.post(
        f"{served.http_url}/v1/messages?beta=true", json=body, headers=served.auth, timeout=10
    )
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    names = [line.removeprefix("event: ") for line in response.text.split("\n") if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_use_round_trip_with_tool_result(anthropic, fake, served, stream):
    fake.script([Reply(tool_calls=(ToolCall("calc", {"expression": "37+48"}, id="toolu_1"),)), "It is 85."])
    client = anthropic.Anthropic(base_url=served.http_url, api_key=served.token, max_retries=0)
    asked = {"model": "fake-model", "max_tokens": 200, "tools": [CALC], "tool_choice": {"type": "auto"}}
    first = [{"role": "user", "content": QUESTION}]
    if stream:
        with client.messages.stream(**asked, messages=first) as events:
            kinds = [event.type for event in events]
            reply = events.get_final_message()
        assert "input_json" in kinds  # input_json_delta events
    else:
        reply = client.messages.create(**asked, messages=first)

    [tool_use] = reply.content
    assert (tool_use.type, tool_use.id, tool_use.name, tool_use.input) == (
        "tool_use", "toolu_1", "calc", {"expression": "37+48"}
    )  # fmt: skip
    assert reply.stop_reason == "tool_use"
    offered = fake.requests[-1].body
    assert offered["tools"] == [{"type": "function", "function": {**CALC_TOOL["function"]}}]
    assert offered["tool_choice"] == "auto" and offered["parallel_tool_calls"] is True

    result = [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "85"}]}]
    turns = [*first, {"role": "assistant", "content": reply.content}, {"role": "user", "content": result}]
    answer = client.messages.create(**asked, messages=turns)
    assert answer.content[0].text == "It is 85." and answer.stop_reason == "end_turn"
    assert fake.requests[-1].body["messages"][1:] == [
        {"role": "assistant", "tool_calls": [{"id": "toolu_1", "type": "function",
         "function": {"name": "calc", "arguments": '{"expression": "37+48"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "85"},
    ]  # fmt: skip


def test_max_tokens_cut_is_stop_reason_max_tokens(anthropic, fake, served):
    fake.script(["a long answer that will not fit"])
    client = anthropic.Anthropic(base_url=served.http_url, api_key=served.token, max_retries=0)
    message = client.messages.create(
        model="fake-model", max_tokens=4, messages=[{"role": "user", "content": "x"}]
    )
    assert (message.stop_reason, message.content[0].text) == ("max_tokens", "a lo")


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"model": "fake-model", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": "fake-model", "max_tokens": 8, "messages": "x"}, "messages"),
        (
            {"model": "fake-model", "max_tokens": 8, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1/x.png"}}]}]},
            "image",
        ),
        ({"model": "fake-model", "max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]}, "role"),
        ({"model": "fake-model", "max_tokens": 8, "messages": [], "tool_choice": {"type": "tool"}}, "name"),
    ],
    ids=["no max_tokens", "messages not a list", "image block", "bad role", "tool choice without name"],
)  # fmt: skip
def test_bad_request_is_a_400_invalid_request_error_naming_the_field(served, body, names):
    response = httpx.post(f"{served.http_url}/v1/messages", json=body, headers=served.auth, timeout=10)
    assert response.status_code == 400
    error = response.json()
    assert (error["type"], error["error"]["type"]) == ("error", "invalid_request_error")
    assert names in error["error"]["message"]


def test_the_client_raises_bad_request_for_an_image(anthropic, served):
    client = anthropic.Anthropic(base_url=served.http_url, api_key=served.token, max_retries=0)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    with pytest.raises(anthropic.BadRequestError, match="image blocks are not supported"):
        client.messages.create(
            model="fake-model", max_tokens=8, messages=[{"role": "user", "content": [image]}]
        )


def test_body_not_json_is_anthropics_400(served):
    response = httpx.post(f"{served.http_url}/v1/messages", content=b"{", headers=served.auth, timeout=10)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("headers", [{}, {"x-api-key": "wrong"}, {"authorization": "Bearer wrong"}])
def test_missing_or_unknown_key_is_a_401_authentication_error(served, headers):
    body = {"model": "fake-model", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
    response = httpx.post(f"{served.http_url}/v1/messages", json=body, headers=headers, timeout=10)
    assert response.status_code == 401
    assert response.json() == {"type": "error", "error": response.json()["error"]}
    assert response.json()["error"]["type"] == "authentication_error"


def test_rollout_key_naming_another_rollout_is_a_403_permission_error(served):
    key = rollout_key(served, new_rollout())
    headers = {"x-api-key": key, "x-otel-rl-rollout-id": new_rollout()}
    body = {"model": "fake-model", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
    response = httpx.post(f"{served.http_url}/v1/messages", json=body, headers=headers, timeout=10)
    assert response.status_code == 403
    assert response.json()["error"]["type"] == "permission_error"


def test_auth_token_as_bearer_is_accepted(anthropic, fake, served):
    fake.script(["ok"])
    client = anthropic.Anthropic(base_url=served.http_url, auth_token=served.token, max_retries=0)
    assert client.messages.create(
        model="fake-model", max_tokens=8, messages=[{"role": "user", "content": "x"}]
    )


def test_vllm_error_and_mid_stream_disconnect_come_in_anthropics_shape(anthropic, fake, served):
    client = anthropic.Anthropic(base_url=served.http_url, api_key=served.token, max_retries=0)
    turn = {"model": "fake-model", "max_tokens": 64, "messages": [{"role": "user", "content": "x"}]}
    fake.inject(Fault(status=500, message="engine fell over"))
    with pytest.raises(anthropic.InternalServerError) as raised:
        client.messages.create(**turn)
    assert raised.value.body["error"] == {"type": "api_error", "message": "engine fell over"}

    fake.script([Reply(content="cut", finish_reason="abort")])  # what vLLM answers a call a reload aborted
    with pytest.raises(anthropic.InternalServerError) as raised:
        client.messages.create(**turn)
    assert raised.value.status_code == 503 and raised.value.response.headers["retry-after"] == "1"
    assert raised.value.body["error"]["type"] == "overloaded_error"

    fake.script(["one two three four five"])
    fake.inject(Fault(error_after_chunks=3, message="engine died mid-stream"))
    with client.messages.stream(**turn) as stream:
        kinds = []
        with pytest.raises(anthropic.APIStatusError, match="engine died mid-stream"):
            kinds.extend(event.type for event in stream)
    assert kinds[0] == "message_start" and "message_stop" not in kinds  # the error is the last event

    fake.script(["one two three four five"])
    fake.inject(Fault(disconnect_after_chunks=3))
    with (
        pytest.raises(anthropic.APIStatusError, match="failed mid-call"),
        client.messages.stream(**turn) as stream,
    ):
        for _ in stream:
            pass


def test_count_tokens_is_the_rendered_prompts_length(anthropic, served):
    client = anthropic.Anthropic(base_url=served.http_url, api_key=served.token, max_retries=0)
    counted = client.messages.count_tokens(
        model="fake-model", system=SYSTEM, messages=[{"role": "user", "content": QUESTION}], tools=[CALC]
    )
    chat_messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    assert counted.input_tokens == len(tokenize(render_chat(chat_messages)))


def test_head_on_the_base_url_answers_without_a_token(served):
    response = httpx.head(served.http_url, timeout=10)
    assert (response.status_code, response.content) == (200, b"")


def test_thinking_comes_before_the_text_in_whole_and_streamed_answers(anthropic, fake, served):
    client = anthropic.Anthropic(base_url=served.http_url, api_key=served.token, max_retries=0)
    turn = {"model": "fake-model", "max_tokens": 200, "messages": [{"role": "user", "content": "2+2?"}]}
    fake.script([Reply(content="Four.", reasoning="two and two")] * 2)
    whole = client.messages.create(**turn)
    with client.messages.stream(**turn) as stream:
        kinds = [event.delta.type for event in stream if event.type == "content_block_delta"]
        streamed = stream.get_final_message()
    for message in (whole, streamed):
        assert [block.type for block in message.content] == ["thinking", "text"]
        assert (message.content[0].thinking, message.content[1].text) == ("two and two", "Four.")
    assert kinds == ["thinking_delta", "signature_delta", "text_delta"]
    assert streamed.content[0].signature  # sent when the thinking block closes, as Anthropic does


def test_translation_keeps_vllms_rendering_of_system_thinking_and_tool_results():
    chat = messages.chat_request({
        "model": "m", "max_tokens": 2048, "stop_sequences": ["END"], "top_k": 5,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=ab12"},
                   {"type": "text", "text": "You code."}, {"type": "text", "text": " Briefly."}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Fix it."}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
             {"type": "tool_use", "id": "t1", "name": "sh", "input": {"cmd": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True,
             "content": [{"type": "text", "text": "a"}, {"type": "text", "text": ""},
                         {"type": "text", "text": "b"}]}]},
        ],
    })  # fmt: skip
    assert chat == {
        "model": "m", "max_tokens": 2048, "max_completion_tokens": 2048, "stop": ["END"], "top_k": 5,
        "thinking_token_budget": 1024,
        "messages": [
            {"role": "system", "content": "You code. Briefly."},
            {"role": "user", "content": "Fix it."},
            {"role": "assistant", "reasoning": "hm", "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "sh", "arguments": '{"cmd": "ls"}'}}]},
            {"role": "tool", "tool_call_id": "t1", "content": "a\n\nb"},
        ],
    }  # fmt: skip


# ------------------------------------------------------------------ in front of real vLLM

GREEDY = {"model": "tiny", "max_tokens": 12, "temperature": 0}
TURN = {**GREEDY, "system": SYSTEM, "messages": [{"role": "user", "content": QUESTION}]}
# A tool round trip as the client sends it back: the model's tool_use, the harness's tool_result. (The tiny
# untrained model never writes a tool call of its own, and Messages has no way to force one's arguments:
# the model's tool_use blocks are checked in front of the fake.)
TOOL_HISTORY = [
    {"role": "user", "content": QUESTION},
    {"role": "assistant", "content": [{"type": "text", "text": "Let me compute it."},
     {"type": "tool_use", "id": "toolu_01", "name": "calc", "input": {"expression": "37+48"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "is_error": False,
     "content": [{"type": "text", "text": "85"}]}, {"type": "text", "text": "Now answer."}]},
]  # fmt: skip
TOOL_TURN = {**TURN, "tools": [CALC], "tool_choice": {"type": "auto"}, "messages": TOOL_HISTORY}
# What differs between two identical calls: ids (vLLM's random ones) and how much of the prompt was cached.
VARYING = re.compile(rb'"id":"[^"]*"|"usage":\{[^}]*\}|event: ping\ndata: \{"type":"ping"\}\n\n')


@pytest.fixture(scope="module")
def gateway(vllm_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    with GatewayServer(tmp_path_factory.mktemp("gateway") / "store.duckdb", vllm=[vllm_server.url]) as server:
        yield server


def both(vllm_server, gateway: GatewayServer, body: dict, rollout: str) -> tuple[bytes, bytes]:
    """The same request to vLLM's own /v1/messages and to the gateway's: both raw bodies."""
    direct = httpx.post(f"{vllm_server.url}/v1/messages", json=body, timeout=60)
    assert direct.status_code == 200, direct.text
    headers = {"x-api-key": ADMIN_TOKEN, "x-otel-rl-rollout-id": rollout}
    ours = httpx.post(f"{gateway.base_url}/v1/messages?beta=true", json=body, headers=headers, timeout=60)
    assert ours.status_code == 200, ours.text
    return direct.content, ours.content


def assert_same_but_ids_and_cache(direct: bytes, ours: bytes) -> None:
    assert VARYING.sub(b"", ours) == VARYING.sub(b"", direct)
    usages = [[json.loads(u[8:]) for u in re.findall(rb'"usage":\{[^}]*\}', raw)] for raw in (direct, ours)]
    cached = ("cache_read_input_tokens", "cache_creation_input_tokens")
    totals = [[u["input_tokens"] + sum(u.get(name, 0) for name in cached) for u in us] for us in usages]
    assert totals[0] == totals[1]  # the same prompt, whatever part of it came from vLLM's prefix cache
    assert [[u["output_tokens"] for u in us] for us in usages[:1]] == [
        [u["output_tokens"] for u in usages[1]]
    ]


def assert_recorded_vllms_chat_tokens(vllm_server, gateway: GatewayServer, body: dict, rollout: str) -> dict:
    """The call's span holds the ids vLLM's chat endpoint gives for the same rendered prompt, greedy."""
    chat = messages.chat_request({**body, "stream": False})
    full = httpx.post(
        f"{vllm_server.url}/v1/chat/completions", json={**chat, "return_token_ids": True}, timeout=60
    )
    [span] = gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{rollout}'")
    assert span["prompt_token_ids"] == full.json()["prompt_token_ids"]
    assert span["choice_token_ids"] == [full.json()["choices"][0]["token_ids"]]
    assert span["attributes"]["otel_rl.gateway.api"] == "messages"
    return span


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_vllm_answer_equals_vllms_own_messages_and_the_span_has_its_tokens(vllm_server, gateway, stream):
    rollout = new_rollout()
    direct, ours = both(vllm_server, gateway, {**TURN, "stream": stream}, rollout)
    assert_same_but_ids_and_cache(direct, ours)
    assert_recorded_vllms_chat_tokens(vllm_server, gateway, TURN, rollout)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_vllm_tool_result_turn_equals_vllms_own_and_the_span_has_its_tokens(vllm_server, gateway, stream):
    rollout = new_rollout()
    direct, ours = both(vllm_server, gateway, {**TOOL_TURN, "stream": stream}, rollout)
    assert_same_but_ids_and_cache(direct, ours)
    span = assert_recorded_vllms_chat_tokens(vllm_server, gateway, TOOL_TURN, rollout)
    recorded = json.loads(span["attributes"]["gen_ai.input.messages"])
    assert [message["role"] for message in recorded] == ["system", "user", "assistant", "tool", "user"]
    assert recorded[2]["parts"][1] == {
        "type": "tool_call", "id": "toolu_01", "name": "calc", "arguments": {"expression": "37+48"}
    }  # fmt: skip
    assert recorded[3]["parts"] == [{"type": "tool_call_response", "id": "toolu_01", "response": "85"}]
    assert json.loads(span["attributes"]["gen_ai.tool.definitions"])[0]["function"]["name"] == "calc"


def test_vllm_count_tokens_equals_vllms_own(anthropic, vllm_server, gateway):
    body = {"model": "tiny", "system": SYSTEM, "tools": [CALC], "messages": [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "calc", "input": {"expression": "37+48"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "85"}]},
    ]}  # fmt: skip
    direct = httpx.post(f"{vllm_server.url}/v1/messages/count_tokens", json=body, timeout=60)
    client = anthropic.Anthropic(base_url=gateway.base_url, api_key=ADMIN_TOKEN, max_retries=0)
    counted = client.messages.count_tokens(**body)
    assert counted.input_tokens == direct.json()["input_tokens"] > 0


def test_vllm_reload_in_the_middle_of_streams_fails_no_request(
    anthropic, vllm_server, tiny_model_dir, gateway, tmp_path
):
    new_weights = init_model(tmp_path / "seed1", seed=1)

    async def keep_streaming(
        prefix: str, stop: asyncio.Event, reloaded: asyncio.Event, after: asyncio.Event
    ) -> list:
        """Turn after turn until `stop`; sets `after` once a turn begun after `reloaded` has ended."""
        finals = []
        async with anthropic.AsyncAnthropic(base_url=gateway.base_url, api_key=ADMIN_TOKEN) as client:
            while not stop.is_set():
                begun_after_reload = reloaded.is_set()
                headers = {"x-otel-rl-rollout-id": f"{prefix}-{uuid.uuid4().hex[:8]}"}
                # anthropic 2.x dropped temperature from its signatures (Claude's newest models refuse it)
                # long turns (ignore_eos), so that a stream is nearly always generating when the reload pauses
                asked = {k: v for k, v in TURN.items() if k != "temperature"} | {"max_tokens": 300}
                extra = {"extra_headers": headers, "extra_body": {"temperature": 0, "ignore_eos": True}}
                async with client.messages.stream(**asked, **extra) as stream:
                    async for _ in stream:  # a yield per event: the reload's post runs while streams do
                        await asyncio.sleep(0)
                    finals.append(await stream.get_final_message())
                if begun_after_reload:
                    after.set()
        return finals

    async def scenario(prefix: str, version: int) -> tuple[list, httpx.Response]:
        stop, reload_done, after_reload = asyncio.Event(), asyncio.Event(), asyncio.Event()
        streams = asyncio.gather(*(keep_streaming(prefix, stop, reload_done, after_reload) for _ in range(3)))
        deadline = time.monotonic() + 60
        while gateway.gateway.coordinator.in_flight < 2 and not streams.done():  # streams are generating
            assert time.monotonic() < deadline, "the streams never got going"
            await asyncio.sleep(0.005)
        if streams.done():
            await streams  # a stream failed before the reload: say how
        reloaded = await set_policy_now(gateway, version, checkpoint=new_weights)
        reload_done.set()
        # a turn under the new version: one begun after the reload and ended
        ended_after = asyncio.ensure_future(after_reload.wait())
        await asyncio.wait({ended_after, streams}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
        if streams.done():
            await streams  # a stream failed: say how
        assert ended_after.done(), "no turn begun after the reload ended within 120 s"
        stop.set()
        return [final for finals in await streams for final in finals], reloaded

    version = policy_version(gateway)
    try:
        for _ in range(10):  # the streams may all be between turns at the pause (a loaded machine): no proof
            prefix, version = f"messages-reload-{uuid.uuid4().hex[:6]}", version + 1
            finals, reloaded = asyncio.run(scenario(prefix, version))  # no stream raised: none failed
            assert reloaded.status_code == 200, reloaded.text
            if reloaded.json()["in_flight_at_pause"] >= 1:
                break
    finally:
        restored = set_policy(gateway, version + 1, checkpoint=tiny_model_dir)  # the session's base weights
    assert restored.status_code == 200, restored.text
    assert reloaded.json()["in_flight_at_pause"] >= 1  # streams were running when the reload paused
    assert all(final.stop_reason in ("end_turn", "max_tokens") for final in finals)
    spans = gateway.spans(f"attributes->>'otel_rl.rollout.id' LIKE '{prefix}-%'", expect=len(finals))
    assert len(spans) == len(finals)
    # straddled the reload: calls under the old version (those in flight at the pause) and the new
    assert {span["attributes"]["otel_rl.policy.version"] for span in spans} == {version - 1, version}
    assert not [span for span in spans if "error.type" in span["attributes"]]
