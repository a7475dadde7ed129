"""The OpenAI Responses API (`POST /v1/responses`) translated to and from Chat Completions, piece by piece."""

import json
import re

import orjson
import pytest

from otel_rl.gateway import responses
from otel_rl.gateway.protocols import ProtocolError

SHELL_TOOL = {
    "type": "function",
    "name": "shell",
    "description": "Runs a shell command and returns its output.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "array", "items": {"type": "string"}}},
        "required": ["command"],
    },
}
# What Codex 0.171 sends on its second turn (shape of codex-rs ResponsesApiRequest), after one shell call.
CODEX_TURN = {
    "model": "tiny",
    "instructions": "You are Codex, a coding agent.",
    "input": [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "sandbox: none"}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List the files."}]},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "I should run ls."}],
            "encrypted_content": None,
        },
        {"type": "function_call", "name": "shell", "arguments": '{"command":["ls"]}', "call_id": "call_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "README.md\n"},
    ],
    "tools": [
        SHELL_TOOL,
        {
            "type": "custom",
            "name": "apply_patch",
            "description": "Applies a patch.",
            "format": {"type": "text"},
        },
        {"type": "web_search"},
        {"type": "local_shell"},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "conversation-1",
    "text": {"verbosity": "low"},
}


# ------------------------------------------------------------------ the request vLLM receives


def test_codex_turn_becomes_the_chat_request_vllm_would_render():
    chat = responses.chat_request(CODEX_TURN)
    assert chat["messages"] == [
        {"role": "system", "content": "You are Codex, a coding agent."},
        {"role": "developer", "content": [{"type": "text", "text": "sandbox: none"}]},
        {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
        {
            "role": "assistant",
            "reasoning": "I should run ls.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "shell", "arguments": '{"command":["ls"]}'},
                }
            ],
        },
        {"role": "tool", "content": "README.md\n", "tool_call_id": "call_1"},
    ]
    # the custom tool is a one-string function (vLLM's shim); hosted tools no model here can run are dropped
    assert [tool["function"]["name"] for tool in chat["tools"]] == ["shell", "apply_patch"]
    assert chat["tools"][0]["function"] == {
        key: SHELL_TOOL[key] for key in ("name", "description", "parameters", "strict")
    }
    assert chat["tools"][1]["function"]["parameters"]["required"] == ["input"]
    assert chat["tool_choice"] == "auto" and chat["parallel_tool_calls"] is False
    assert chat["reasoning_effort"] == "medium"
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert "n" not in chat and "logprobs" not in chat


def test_sampling_fields_map_to_their_chat_names():
    chat = responses.chat_request(
        {
            "model": "tiny",
            "input": "hi",
            "temperature": 0,
            "top_p": 0.5,
            "max_output_tokens": 7,
            "seed": 3,
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 2,
            "tool_choice": {"type": "function", "name": "shell"},
            "text": {
                "format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}
            },
        }
    )
    assert chat == {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "tool_choice": {"type": "function", "function": {"name": "shell"}},
        "temperature": 0,
        "top_p": 0.5,
        "max_tokens": 7,
        "seed": 3,
        "logprobs": True,
        "top_logprobs": 2,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True},
        },
    }


def test_items_of_one_assistant_turn_join_one_message_and_a_partial_last_one_is_continued():
    chat = responses.chat_request(
        {
            "model": "tiny",
            "input": [
                {"role": "user", "content": "Say hi twice."},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi."}]},
                {"type": "function_call", "name": "a", "arguments": "{}", "call_id": "c1"},
                {"type": "function_call", "name": "b", "arguments": "{}", "call_id": "c2"},
                {"type": "custom_tool_call", "name": "apply_patch", "input": "*** Begin", "call_id": "c3"},
                {"type": "custom_tool_call_output", "call_id": "c3", "output": [{"type": "input_text",
                                                                                 "text": "ok"}]},
                {"type": "message", "role": "assistant", "status": "incomplete", "content": [
                    {"type": "output_text", "text": "Hi "}, {"type": "output_text", "text": "again"}]},
            ],
        }
    )  # fmt: skip
    assistant = chat["messages"][1]
    assert assistant["content"] == "Hi."
    assert [call["function"]["name"] for call in assistant["tool_calls"]] == ["a", "b", "apply_patch"]
    assert assistant["tool_calls"][2]["function"]["arguments"] == json.dumps({"input": "*** Begin"})
    assert chat["messages"][2] == {
        "role": "tool",
        "content": [{"type": "text", "text": "ok"}],
        "tool_call_id": "c3",
    }
    assert chat["messages"][3] == {"role": "assistant", "content": "Hi again"}
    assert chat["continue_final_message"] is True and chat["add_generation_prompt"] is False


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"previous_response_id": "resp_1"}, "`previous_response_id` is not supported: the gateway keeps no"),
        ({"conversation": "conv_1"}, "`conversation` is not supported"),
        ({"background": True}, "`background` is not supported"),
        ({"model": None}, "`model` must be a non-empty string"),
        ({"input": []}, "`input` must be a string or a non-empty list"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, '`input[0].type` "item_reference" is not'),
        ({"input": [{"role": "tool", "content": "x"}]}, "`input[0].role` must be one of"),
        (
            {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "`input[0].call_id` must be",
        ),
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "`input[0].content[0]` must be"),
        (
            {"input": [{"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}]},
            "`input[0].encrypted_content` is not supported",
        ),
        ({"tools": [{"type": "function"}]}, "`tools[0].name` must be a non-empty string"),
        ({"tools": {"type": "function"}}, "`tools` must be a list"),
        ({"tool_choice": {"type": "allowed_tools"}}, "`tool_choice` must be"),
        ({"max_output_tokens": 0}, "`max_output_tokens` must be at least 1"),
        ({"temperature": "hot"}, "`temperature` has the wrong type"),
        ({"include": "logprobs"}, "`include` must be a list of strings"),
    ],
)
def test_requests_the_gateway_cannot_serve_are_refused_naming_the_field(change, named):
    with pytest.raises(ProtocolError, match="^" + re.escape(named)):
        responses.chat_request({"model": "tiny", "input": "hi"} | change)


def test_error_body_is_openais_shape_with_a_string_or_null_code():
    assert orjson.loads(responses.error_body(400, "bad `input`", "BadRequestError")) == {
        "error": {"message": "bad `input`", "type": "BadRequestError", "param": None, "code": None}
    }


# ------------------------------------------------------------------ the response the client gets


def chat_tool_call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


CHAT_RESPONSE = {
    "id": "chatcmpl-abc",
    "object": "chat.completion",
    "created": 1767225600,
    "model": "tiny",
    "prompt_token_ids": [1, 2, 3],
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Let me look.",
                "reasoning": "ls shows files",
                "tool_calls": [
                    chat_tool_call("call_9", "shell", '{"command":["ls"]}'),
                    chat_tool_call("call_10", "apply_patch", '{"input": "P"}'),
                ],
            },
            "logprobs": {"content": [{"token": "L", "logprob": -0.5, "bytes": [76], "top_logprobs": []}]},
            "finish_reason": "tool_calls",
            "token_ids": [4, 5],
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, "prompt_tokens_details": None},
}  # fmt: skip


def test_chat_response_becomes_reasoning_message_and_tool_call_items():
    body = responses.response_body(CHAT_RESPONSE, CODEX_TURN)
    assert body["id"] == "resp_abc" and body["object"] == "response" and body["status"] == "completed"
    assert [item["type"] for item in body["output"]] == [
        "reasoning",
        "message",
        "function_call",
        "custom_tool_call",
    ]
    reasoning, message, call, custom = body["output"]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "ls shows files"}]
    assert message["content"] == [
        {"type": "output_text", "text": "Let me look.", "annotations": [], "logprobs": []}
    ]
    assert (call["call_id"], call["name"], call["arguments"]) == ("call_9", "shell", '{"command":["ls"]}')
    assert (custom["call_id"], custom["name"], custom["input"]) == ("call_10", "apply_patch", "P")
    assert body["usage"] == {
        "input_tokens": 3,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 5,
    }
    assert body["incomplete_details"] is None and body["parallel_tool_calls"] is False
    assert "prompt_token_ids" not in orjson.dumps(body).decode()


def test_a_response_cut_by_max_output_tokens_is_incomplete_and_logprobs_come_when_included():
    chat = json.loads(json.dumps(CHAT_RESPONSE))
    chat["choices"][0]["finish_reason"] = "length"
    chat["choices"][0]["message"].update(tool_calls=[], reasoning=None)
    request = {
        "model": "tiny",
        "input": "x",
        "max_output_tokens": 2,
        "include": ["message.output_text.logprobs"],
    }
    body = responses.response_body(chat, request)
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["content"][0]["logprobs"] == [
        {"token": "L", "logprob": -0.5, "bytes": [76], "top_logprobs": []}
    ]


# ------------------------------------------------------------------ the stream


def stream_chunks(chat: dict) -> list[dict]:
    """The chunks vLLM streams for `chat` (one choice): role, reasoning, words, tool-call header and
    arguments, finish, usage."""
    message, base = (
        chat["choices"][0]["message"],
        {"id": chat["id"], "created": chat["created"], "model": "tiny"},
    )

    def chunk(delta: dict, finish: str | None = None) -> dict:
        return base | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish, "token_ids": [7]}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    for field in ("reasoning", "content"):
        chunks += [chunk({field: word}) for word in re.findall(r"\S+\s*", message.get(field) or "")]
    for k, call in enumerate(message.get("tool_calls") or ()):
        head = {
            "index": k,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"]},
        }
        chunks += [chunk({"tool_calls": [head]}), chunk({"tool_calls": [{"index": k, "function": {
            "arguments": call["function"]["arguments"]}}]})]  # fmt: skip
    chunks.append(chunk({}, chat["choices"][0]["finish_reason"]))
    chunks.append(base | {"choices": [], "usage": chat["usage"]})
    return chunks


def parse_events(data: bytes) -> list[dict]:
    events = []
    for block in data.decode().split("\n\n")[:-1]:
        kind, payload = block.split("\n")
        event = json.loads(payload.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        events.append(event)
    return events


def run_stream(chat: dict, request: dict) -> list[dict]:
    stream = responses.Stream(request)
    data = b"".join(stream.feed(chunk) for chunk in stream_chunks(chat)) + stream.finish()
    return parse_events(data)


def without_item_ids(value):
    """A response or item with the ids that differ between a stream and a whole response left out."""
    if isinstance(value, dict):
        return {k: without_item_ids(v) for k, v in value.items() if k != "id"}
    if isinstance(value, list):
        return [without_item_ids(v) for v in value]
    return value


def test_stream_sends_openais_events_in_order_and_completes_with_the_whole_response():
    events = run_stream(CHAT_RESPONSE, CODEX_TURN)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    kinds = [event["type"] for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    reasoning = (
        ["response.output_item.added", "response.content_part.added"]
        + ["response.reasoning_text.delta"] * 3
        + ["response.reasoning_text.done", "response.content_part.done", "response.output_item.done"]
    )
    message = (
        ["response.output_item.added", "response.content_part.added"]
        + ["response.output_text.delta"] * 3
        + ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    )
    call = ["response.output_item.added", "response.function_call_arguments.delta",
            "response.function_call_arguments.done", "response.output_item.done"]  # fmt: skip
    custom = [
        "response.output_item.added",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
    ]
    assert kinds[2:-1] == reasoning + message + call + custom
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Let me look."
    completed = events[-1]["response"]
    assert completed["status"] == "completed" and completed["id"] == events[0]["response"]["id"] == "resp_abc"
    done_items = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert completed["output"] == done_items
    # the streamed response is the non-streamed one, ids of items aside
    whole = responses.response_body(CHAT_RESPONSE, CODEX_TURN)
    assert without_item_ids(completed) == without_item_ids(whole)
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [0, 1, 2, 3]


def test_stream_cut_by_max_output_tokens_completes_with_an_incomplete_response():
    chat = json.loads(json.dumps(CHAT_RESPONSE))
    chat["choices"][0]["finish_reason"] = "length"
    chat["choices"][0]["message"].update(tool_calls=[], reasoning=None)
    events = run_stream(chat, {"model": "tiny", "input": "x", "max_output_tokens": 2})
    assert events[-1]["type"] == "response.completed"  # what Codex waits for; vLLM's endpoint does the same
    assert events[-1]["response"]["status"] == "incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_stream_error_ends_with_response_failed():
    stream = responses.Stream({"model": "tiny", "input": "x"})
    first = parse_events(stream.feed(stream_chunks(CHAT_RESPONSE)[1]))
    failed = parse_events(
        stream.error(503, "the call was aborted for a weight reload; retry it", "ServiceUnavailableError")
    )
    assert [e["type"] for e in first][:2] == ["response.created", "response.in_progress"]
    assert failed[-1]["type"] == "response.failed" and failed[-1]["sequence_number"] == len(first)
    assert failed[-1]["response"]["status"] == "failed"
    assert failed[-1]["response"]["error"] == {
        "code": "server_error",
        "message": "ServiceUnavailableError: the call was aborted for a weight reload; retry it",
    }


def test_a_call_of_a_namespaced_function_names_its_namespace_streamed_or_not():
    namespace = {"type": "namespace", "name": "agents", "tools": [{"type": "function", "name": "spawn"}]}
    request = {"model": "tiny", "input": "x", "tools": [namespace]}
    assert [t["function"]["name"] for t in responses.chat_request(request)["tools"]] == ["agents__spawn"]
    chat = json.loads(json.dumps(CHAT_RESPONSE))
    chat["choices"][0]["message"] = {
        "role": "assistant",
        "tool_calls": [chat_tool_call("c1", "agents__spawn", "{}")],
    }
    [whole] = responses.response_body(chat, request)["output"]
    [streamed] = run_stream(chat, request)[-1]["response"]["output"]
    for item in (whole, streamed):
        assert (item["type"], item["namespace"], item["name"], item["call_id"]) == (
            "function_call",
            "agents",
            "spawn",
            "c1",
        )
    # sent back, the call is the flat name the model wrote
    replay = {
        "model": "tiny",
        "input": [whole, {"type": "function_call_output", "call_id": "c1", "output": "ok"}],
    }
    assert (
        responses.chat_request(replay)["messages"][0]["tool_calls"][0]["function"]["name"] == "agents__spawn"
    )
