"""Anthropic Messages' streaming events, built from vLLM's Chat Completions chunks as vLLM 0.32 builds them.

Events: message_start (then a ping, as Anthropic sends one), content_block_start / _delta (text_delta,
thinking_delta, input_json_delta, signature_delta) / _stop per block, message_delta (stop_reason, usage),
message_stop; an `error` event ends a failed stream.
"""

import uuid
from typing import Any

import orjson

PING = b'event: ping\ndata: {"type":"ping"}\n\n'


class Stream:
    """One call's stream: `feed` each parsed chat chunk, `finish` at vLLM's `[DONE]`."""

    def __init__(self, request: dict[str, Any]) -> None:
        self._started = False
        self._next_index = 0  # the index of the next content block
        self._block: str | None = None  # the open block's type
        self._signature: str | None = None  # a thinking block's signature, sent when it closes
        self._tool_use_id: str | None = None  # the open tool_use block's id
        self._tool_ids: dict[int, str] = {}  # chat tool-call index -> tool_use id
        # Text the model wrote inside a tool_use block: sent as a text block of its own after it closes.
        self._pending_text: list[str] = []
        self._last_tool_arguments: list[str] = []
        self._tool_used = False
        self._finish_reason: str | None = None
        self._matched: Any = None  # the stop string vLLM matched, if any

    def feed(self, chunk: dict[str, Any]) -> bytes:
        if not self._started:  # vLLM's first chunk is the role's, with no content
            self._started = True
            message = {
                "id": chunk.get("id"),
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": chunk.get("model"),
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage_of(chunk.get("usage")),
            }
            return _event("message_start", {"type": "message_start", "message": message}) + PING
        choices = chunk.get("choices") or []
        if not choices:  # the usage chunk, after the last choice chunk
            events = self._close_block()
            tool_complete = self._tool_used and _is_json("".join(self._last_tool_arguments))
            stop_reason, stop_sequence = stop_reason_of(
                self._finish_reason or "stop",
                self._matched,
                tool_used=self._tool_used,
                tool_complete=tool_complete,
            )
            delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
            payload = {"type": "message_delta", "delta": delta, "usage": usage_of(chunk.get("usage"))}
            return events + _event("message_delta", payload)
        choice = choices[0]
        if choice.get("finish_reason") is not None:
            self._finish_reason, self._matched = choice["finish_reason"], choice.get("stop_reason")
        delta = choice.get("delta") or {}
        events = b""
        if delta.get("reasoning"):
            if self._block != "thinking":
                events += self._close_block() + self._open({"type": "thinking", "thinking": ""})
            events += self._delta({"type": "thinking_delta", "thinking": delta["reasoning"]})
        if delta.get("content"):
            if self._block == "tool_use":
                self._pending_text.append(delta["content"])
            else:
                if self._block != "text":
                    events += self._close_block() + self._open({"type": "text", "text": ""})
                events += self._delta({"type": "text_delta", "text": delta["content"]})
        for call in delta.get("tool_calls") or ():
            events += self._tool_call(call)
        return events

    def _tool_call(self, call: dict[str, Any]) -> bytes:
        function = call.get("function") or {}
        events = b""
        call_id = call.get("id")
        if call_id is not None:
            self._tool_ids[call.get("index", 0)] = call_id
            if self._tool_use_id != call_id and function.get("name") is not None:
                events += self._close_block()
                self._tool_used = True
                self._last_tool_arguments = []
                events += self._open(
                    {"type": "tool_use", "id": call_id, "name": function["name"], "input": {}}
                )
        else:
            call_id = self._tool_ids.get(call.get("index", 0))
        arguments = function.get("arguments")
        if arguments and call_id is not None and self._tool_use_id == call_id:
            self._last_tool_arguments.append(arguments)
            events += self._delta({"type": "input_json_delta", "partial_json": arguments})
        return events

    def finish(self) -> bytes:
        return self._close_block() + _event("message_stop", {"type": "message_stop"})

    def error(self, status: int, message: str, error_type: str) -> bytes:
        return _event("error", orjson.loads(error_body(status, message, error_type)))

    def _open(self, block: dict[str, Any]) -> bytes:
        self._block = block["type"]
        self._signature = uuid.uuid4().hex if block["type"] == "thinking" else None
        self._tool_use_id = block.get("id") if block["type"] == "tool_use" else None
        payload = {"type": "content_block_start", "content_block": block, "index": self._next_index}
        return _event("content_block_start", payload)

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event(
            "content_block_delta", {"type": "content_block_delta", "delta": delta, "index": self._next_index}
        )

    def _close_block(self) -> bytes:
        """Close the open block, then send the text held back while a tool_use block was open."""
        events = self._stop_block()
        if self._pending_text:
            text = "".join(self._pending_text)
            self._pending_text.clear()
            events += self._open({"type": "text", "text": ""})
            events += self._delta({"type": "text_delta", "text": text}) + self._stop_block()
        return events

    def _stop_block(self) -> bytes:
        if self._block is None:
            return b""
        events = b""
        if self._signature is not None:
            events += self._delta({"type": "signature_delta", "signature": self._signature})
        events += _event("content_block_stop", {"type": "content_block_stop", "index": self._next_index})
        self._block = self._signature = self._tool_use_id = None
        self._next_index += 1
        return events


def _event(name: str, payload: dict[str, Any]) -> bytes:
    # Written by hand, not with an SSE library (sse-starlette's ServerSentEvent): the data is orjson's JSON,
    # one line with no newline in it, so an event is these bytes exactly; the library would decode, split and
    # re-encode each of a stream's many events.
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _is_json(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def stop_reason_of(
    finish_reason: str | None, matched: Any, *, tool_used: bool, tool_complete: bool
) -> tuple[str | None, str | None]:
    """vLLM's finish reason (and the stop string it matched, if any) → `stop_reason`, `stop_sequence`."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason not in ("stop", "tool_calls"):
        return None, None
    if tool_used and tool_complete:
        return "tool_use", None
    if isinstance(matched, str):  # vLLM's stop_reason: the matched stop string, or an int stop token id
        return "stop_sequence", matched
    if finish_reason == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


def usage_of(usage: dict[str, Any] | None) -> dict[str, int]:
    """Anthropic's usage: `input_tokens` excludes the prompt tokens read from (or written to) the cache."""
    if not usage:
        return {"input_tokens": 0, "output_tokens": 0}
    input_tokens = usage.get("prompt_tokens") or 0
    details = usage.get("prompt_tokens_details") or {}
    cache: dict[str, int] = {}
    for name, field in (
        ("cache_creation_input_tokens", "created_cache_tokens"),
        ("cache_read_input_tokens", "cached_tokens"),
    ):
        if details.get(field) is not None:
            cache[name] = details[field]
            input_tokens -= details[field]
    return {
        "input_tokens": max(0, input_tokens),
        "output_tokens": usage.get("completion_tokens") or 0,
        **cache,
    }


ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",  # a paused or exhausted gateway: the Anthropic clients retry it
    529: "overloaded_error",
}


def error_body(status: int, message: str, error_type: str) -> bytes:
    """Anthropic's error shape; its type follows the status (the gateway's `error_type` is OpenAI's)."""
    return orjson.dumps(
        {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}
    )
