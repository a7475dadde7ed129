"""Pure pieces of the gateway's relay: SSE framing, stream assembly, what the client did not ask for."""

import json
from collections.abc import Iterator

import httpx
import pytest
from fake_vllm import MODEL, FakeVLLM, Reply, ToolCall

from otel_rl.gateway.outputs import StreamAssembler, parse_chat_response
from otel_rl.gateway.upstream import ClientAsked, SSEEvents, strip_response, upstream_body

ASK_ALL = {"logprobs": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeVLLM]:
    with FakeVLLM() as server:
        yield server


def stream_bytes(fake: FakeVLLM, body: dict) -> bytes:
    response = httpx.post(f"{fake.url}/chat/completions", json={**body, "stream": True}, timeout=10)
    response.raise_for_status()
    return response.content


@pytest.mark.parametrize("piece", [1, 7, 64, 100_000])
def test_events_split_anywhere_across_reads_are_reassembled(fake, piece):
    raw = stream_bytes(fake, {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "n": 2})
    events = SSEEvents()
    payloads = [p for start in range(0, len(raw), piece) for p in events.feed(raw[start : start + piece])]
    assert payloads == [line[6:].decode() for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert payloads[-1] == "[DONE]"


@pytest.mark.parametrize("piece", [1, 3, 100])
def test_crlf_line_ends_multi_line_data_and_comments_are_read_as_the_sse_format_says(piece):
    # vLLM writes LF; a server behind a proxy may write CRLF or CR, and an event's data may span lines
    raw = (
        b": keep-alive\r\n\r\n"
        b'data: {"a":\r\ndata: 1}\r\n\r\n'
        b"event: ping\rdata:  two spaces\r\r"
        b"data: caf\xc3\xa9\n\n"
        b"data: [DONE]\n\n"
    )
    events = SSEEvents()
    payloads = [p for start in range(0, len(raw), piece) for p in events.feed(raw[start : start + piece])]
    assert payloads == ['{"a":\n1}', " two spaces", "caf\u00e9", "[DONE]"]
    assert json.loads(payloads[0]) == {"a": 1}


def test_streamed_and_whole_responses_assemble_to_the_same_output(fake):
    fake.script(
        lambda request, index: (
            Reply(tool_calls=(ToolCall("calc", {"expression": "1 + 2"}),)) if index else "Hm."
        )
    )
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {}}}]
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "n": 2,
        "tools": tools,
        **ASK_ALL,
    }
    whole = httpx.post(f"{fake.url}/chat/completions", json=body, timeout=10).json()
    assembler = StreamAssembler("chat")
    for payload in SSEEvents().feed(stream_bytes(fake, body)):
        if payload != "[DONE]":
            assembler.add(json.loads(payload))

    expected = parse_chat_response(whole)
    streamed = assembler.output
    assert streamed.choices[1].tool_calls[0].name == "calc"
    assert streamed.prompt_token_ids == expected.prompt_token_ids
    for got, want in zip(streamed.choices, expected.choices, strict=True):
        assert (got.text, got.token_ids, got.logprobs, got.finish_reason) == (
            want.text, want.token_ids, want.logprobs, want.finish_reason,
        )  # fmt: skip
        assert all(call.id for call in got.tool_calls)  # (ids differ between two calls)
        assert [(c.name, json.loads(c.arguments)) for c in got.tool_calls] == [
            (c.name, json.loads(c.arguments)) for c in want.tool_calls
        ]


def test_fields_the_client_did_not_ask_for_are_nulled_the_others_kept():
    response = {
        "prompt_token_ids": [1, 2],
        "choices": [{"index": 0, "token_ids": [3], "logprobs": {"content": [{"logprob": -0.5}]}}],
    }
    stripped = strip_response(json.loads(json.dumps(response)), ClientAsked(logprobs=True, token_ids=False))
    assert stripped == {
        "prompt_token_ids": None,
        "choices": [{"index": 0, "token_ids": None, "logprobs": {"content": [{"logprob": -0.5}]}}],
    }


def test_upstream_body_adds_ids_and_logprobs_and_forces_the_splits_sampling():
    body = {"model": "m", "messages": [], "temperature": 0.2, "logprobs": False}
    sent, asked = upstream_body("chat", body, {"temperature": 1.0}, "otel-rl-policy")
    assert sent == {"model": "otel-rl-policy", "messages": [], "temperature": 1.0, "logprobs": True,
                    "return_token_ids": True}  # fmt: skip
    assert asked == ClientAsked(logprobs=False, token_ids=False)
    assert body["temperature"] == 0.2  # the client's body is left as it was
    sent, asked = upstream_body("text_completion", {"prompt": "x", "logprobs": 0}, {}, None)
    assert (sent["logprobs"], asked.logprobs) == (0, True)
