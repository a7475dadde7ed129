"""vLLM's Chat Completions chunks → the Responses API's server-sent events, item by item.

Codex reads `response.created`, `response.output_text.delta`, `response.output_item.done` (the complete
items) and waits for `response.completed` (or `response.failed`) before the stream closes; the other events
are those OpenAI and vLLM's own `/v1/responses` send, and the official client's stream helpers expect.
"""

import uuid
from typing import Any

import orjson

from otel_rl.gateway.responses_items import (
    call_id_suffix,
    custom_tool_names,
    function_tool_names,
    message_item,
    reasoning_item,
    response_object,
    responses_logprob,
    status_of,
    tool_call_item,
    wants_logprobs,
)


class _OpenItem:
    """The output item being streamed: its kind, the text or arguments so far; a tool call's index and the
    name the model called (a namespaced function's flat `namespace__name`)."""

    def __init__(
        self,
        kind: str,
        item: dict[str, Any],
        output_index: int,
        tool_index: int | None = None,
        name: str = "",
    ) -> None:
        self.kind = kind  # "message" | "reasoning" | "tool_call"
        self.item = item
        self.output_index = output_index
        self.tool_index = tool_index
        self.name = name
        self.text = ""
        self.logprobs: list[dict[str, Any]] = []


class Stream:
    """One streamed call: `feed` each parsed chat chunk, then `finish` at `[DONE]` (or `error`)."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request
        self._logprobs = wants_logprobs(request)
        self._custom_tools = custom_tool_names(request.get("tools"))
        self._namespaced = function_tool_names(request.get("tools"))
        self._sequence = 0
        self._suffix: str | None = None
        self._created_at: Any = None
        self._model: Any = request.get("model")
        self._done: list[dict[str, Any]] = []  # completed output items, in order
        self._open: _OpenItem | None = None
        self._finish_reason: str | None = None
        self._usage: dict[str, Any] | None = None

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """The events one chat chunk makes."""
        events = [] if self._suffix is not None else self._start(chunk)
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning") or delta.get("reasoning_content")
            if reasoning:
                events += self._text_delta("reasoning", reasoning, None)
            if delta.get("content"):
                logprobs = (choice.get("logprobs") or {}).get("content") if self._logprobs else None
                events += self._text_delta("message", delta["content"], logprobs)
            for call in delta.get("tool_calls") or ():
                events += self._tool_call_delta(call)
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
        return b"".join(events)

    def finish(self) -> bytes:
        """The events that close the stream: the open item's, then `response.completed`.

        A turn cut by `max_output_tokens` also ends with `response.completed`, its response `incomplete`
        (as vLLM's own endpoint ends it; OpenAI sends `response.incomplete`): Codex and the `openai`
        client's stream helpers accept a turn only from `response.completed`, and a rollout should go on.
        """
        events = [] if self._suffix is not None else self._start({})
        events += self._close()
        response = self._response(status_of(self._finish_reason), self._done)
        events.append(self._event("response.completed", response=response))
        return b"".join(events)

    def error(self, status: int, message: str, error_type: str) -> bytes:
        """`response.failed`: Codex retries it (a reload's abort asks for exactly that)."""
        events = [] if self._suffix is not None else self._start({})
        code = "server_error" if status >= 500 else "invalid_request_error"
        failure = {"code": code, "message": f"{error_type}: {message}"}
        events.append(self._event("response.failed", response=self._response("failed", self._done, failure)))
        return b"".join(events)

    # ------------------------------------------------------------------ events

    def _start(self, chunk: dict[str, Any]) -> list[bytes]:
        self._suffix = call_id_suffix(chunk.get("id")) if chunk.get("id") else uuid.uuid4().hex
        self._created_at = chunk.get("created")
        self._model = chunk.get("model") or self._model
        response = self._response("in_progress", [])
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def _text_delta(self, kind: str, text: str, logprobs: list[dict[str, Any]] | None) -> list[bytes]:
        events = self._open_item(kind) if self._open is None or self._open.kind != kind else []
        current = self._open
        assert current is not None
        current.text += text
        where = {"item_id": current.item["id"], "output_index": current.output_index, "content_index": 0}
        if kind == "reasoning":
            events.append(self._event("response.reasoning_text.delta", **where, delta=text))
        else:
            converted = [responses_logprob(entry) for entry in logprobs or ()]
            current.logprobs += converted
            events.append(self._event("response.output_text.delta", **where, delta=text, logprobs=converted))
        return events

    def _tool_call_delta(self, call: dict[str, Any]) -> list[bytes]:
        index = call.get("index", 0)
        function = call.get("function") or {}
        events = []
        if self._open is None or self._open.kind != "tool_call" or self._open.tool_index != index:
            events += self._close()
            call_id, name = call.get("id") or f"call_{self._suffix}_{index}", function.get("name") or ""
            item = tool_call_item(
                f"fc_{self._suffix}_{index}",
                call_id,
                name,
                "",
                "in_progress",
                custom_tools=self._custom_tools,
                namespaced=self._namespaced,
            )
            self._open = _OpenItem("tool_call", item, len(self._done), index, name)
            events.append(self._event("response.output_item.added", output_index=len(self._done), item=item))
        current = self._open
        arguments = function.get("arguments") or ""
        if arguments:
            current.text += arguments
            if current.item["type"] == "function_call":  # a custom tool's input is sent whole, when done
                where = {"item_id": current.item["id"], "output_index": current.output_index}
                events.append(self._event("response.function_call_arguments.delta", **where, delta=arguments))
        return events

    def _open_item(self, kind: str) -> list[bytes]:
        events = self._close()
        output_index = len(self._done)
        if kind == "reasoning":
            item = reasoning_item(f"rs_{self._suffix}_{output_index}", "", "in_progress")
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = message_item(f"msg_{self._suffix}_{output_index}", "", None, "in_progress")
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self._open = _OpenItem(kind, item, output_index)
        where = {"item_id": item["id"], "output_index": output_index, "content_index": 0}
        events.append(self._event("response.output_item.added", output_index=output_index, item=item))
        events.append(self._event("response.content_part.added", **where, part=part))
        return events

    def _close(self) -> list[bytes]:
        """The events that complete the open item, if any."""
        current, self._open = self._open, None
        if current is None:
            return []
        item_id, output_index = current.item["id"], current.output_index
        where = {"item_id": item_id, "output_index": output_index}
        events = []
        if current.kind == "tool_call":
            item = tool_call_item(
                item_id,
                current.item["call_id"],
                current.name,
                current.text,
                "completed",
                custom_tools=self._custom_tools,
                namespaced=self._namespaced,
            )
            if item["type"] == "function_call":
                events.append(
                    self._event("response.function_call_arguments.done", **where, arguments=current.text)
                )
            else:
                events.append(
                    self._event("response.custom_tool_call_input.done", **where, input=item["input"])
                )
        elif current.kind == "reasoning":
            item = reasoning_item(item_id, current.text, "completed")
            events.append(
                self._event("response.reasoning_text.done", **where, content_index=0, text=current.text)
            )
            events.append(
                self._event("response.content_part.done", **where, content_index=0, part=item["content"][0])
            )
        else:
            item = message_item(item_id, current.text, current.logprobs, "completed")
            part = item["content"][0]
            events.append(
                self._event(
                    "response.output_text.done",
                    **where,
                    content_index=0,
                    text=current.text,
                    logprobs=part["logprobs"],
                )
            )
            events.append(self._event("response.content_part.done", **where, content_index=0, part=part))
        events.append(self._event("response.output_item.done", output_index=output_index, item=item))
        self._done.append(item)
        return events

    def _response(
        self, status: str, output: list[dict[str, Any]], error: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return response_object(
            self.request,
            response_id=f"resp_{self._suffix}",
            created_at=self._created_at,
            model=self._model,
            output=output,
            status=status,
            usage=self._usage if status != "in_progress" else None,
            error=error,
        )

    def _event(self, kind: str, **fields: Any) -> bytes:
        """One event, `event: <type>` and its JSON data with the stream's next `sequence_number`."""
        payload = {"type": kind, **fields, "sequence_number": self._sequence}
        self._sequence += 1
        # By hand, as messages_stream._event says why: orjson's one-line JSON makes the event these bytes.
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
