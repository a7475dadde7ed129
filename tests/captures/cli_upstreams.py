"""A scripted model server for coding-CLI captures: Chat Completions (tests/fake_vllm.py), OpenAI Responses
and Anthropic Messages, streamed as the real APIs stream them, answering a coding agent's turns from one
script.

The script (`CodingScript`): a request that offers a shell tool and carries no tool result yet gets the shell
tool call; one that carries a tool result gets the final answer; a request without a shell tool (a title, a
summary) gets a short text. Every answer is recorded in `.answers`, in order, for the capture's expected.json.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).parent.parent))
from fake_vllm import CREATED, FakeVLLM, RecordedRequest, Reply, ToolCall, tokenize  # noqa: E402

# The shell tool of each CLI, by the name it offers the model under.
SHELL_TOOLS = ("run_shell_command", "bash", "Bash", "shell", "exec_command", "shell_command")
FINAL_ANSWER = "Fixed: mean() now divides by len(values)."
SIDE_ANSWER = "Fix mean divisor"
# Python rather than sed: Qwen Code refuses a sed edit of a file its read tool has not read first.
FIX_COMMAND = (
    "python3 -c \"import pathlib; p = pathlib.Path('stats.py'); "
    "p.write_text(p.read_text().replace('(len(values) + 1)', 'len(values)'))\""
)


def shell_arguments(tool: str, command: str = FIX_COMMAND) -> dict[str, Any]:
    """The fix as the arguments of one CLI's shell tool."""
    if tool in ("shell",):  # Codex's classic shell tool takes an argv
        return {"command": ["bash", "-lc", command], "workdir": "."}
    if tool == "exec_command":
        return {"cmd": command}
    return {"command": command, "description": "Fix the divisor in mean()"}


@dataclass
class Answer:
    """One scripted answer: what was asked (API, tools offered, whether a tool result was in it), and said."""

    api: str
    tools: list[str]
    saw_tool_result: bool
    stream: bool
    text: str | None = None
    tool_call: dict[str, Any] | None = None  # name, arguments, id

    def as_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


@dataclass
class CodingScript:
    answers: list[Answer] = field(default_factory=list)
    command: str = FIX_COMMAND  # the shell command of the tool call

    def answer(self, api: str, tools: list[str], saw_tool_result: bool, stream: bool) -> Answer:
        shell = next((name for name in SHELL_TOOLS if name in tools), None)
        answer = Answer(api, tools, saw_tool_result, stream)
        if shell is None or saw_tool_result:
            answer.text = FINAL_ANSWER if shell else SIDE_ANSWER
        else:
            call_id = f"call_{len(self.answers):04d}"
            answer.tool_call = {
                "name": shell,
                "arguments": shell_arguments(shell, self.command),
                "id": call_id,
            }
        self.answers.append(answer)
        return answer

    def chat_reply(self, body: dict[str, Any], index: int) -> Reply:
        """FakeVLLM's responder for Chat Completions."""
        tools = [tool["function"]["name"] for tool in body.get("tools") or []]
        saw = any(message.get("role") == "tool" for message in body["messages"])
        answer = self.answer("chat", tools, saw, bool(body.get("stream")))
        if answer.tool_call:
            call = answer.tool_call
            return Reply(tool_calls=(ToolCall(call["name"], call["arguments"], call["id"]),))
        return Reply(content=answer.text or "")


def sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


# --- OpenAI Responses -------------------------------------------------------------------------------------


def responses_events(
    answer: Answer, model: str, number: int, input_tokens: int
) -> Iterator[tuple[str, dict]]:
    """The Responses API's stream of one answer: created, in_progress, the output item's events, completed."""
    response_id = f"resp_{number:08d}"
    head = {"id": response_id, "object": "response", "created_at": CREATED, "model": model, "output": [],
            "status": "in_progress", "error": None, "incomplete_details": None, "usage": None}  # fmt: skip
    yield "response.created", {"type": "response.created", "response": head}
    yield "response.in_progress", {"type": "response.in_progress", "response": head}
    if answer.tool_call:
        call = answer.tool_call
        arguments = json.dumps(call["arguments"])
        item_id = f"fc_{number:08d}"
        item = {"id": item_id, "type": "function_call", "status": "in_progress", "arguments": "",
                "call_id": call["id"], "name": call["name"]}  # fmt: skip
        done = item | {"status": "completed", "arguments": arguments}
        yield (
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": 0, "item": item},
        )
        delta = {"type": "response.function_call_arguments.delta", "item_id": item_id, "output_index": 0}
        yield "response.function_call_arguments.delta", delta | {"delta": arguments}
        yield "response.function_call_arguments.done", {"type": "response.function_call_arguments.done",
                                                        "item_id": item_id, "output_index": 0,
                                                        "arguments": arguments}  # fmt: skip
        output_tokens = len(tokenize(arguments))
    else:
        text = answer.text or ""
        item_id = f"msg_{number:08d}"
        item = {"id": item_id, "type": "message", "status": "in_progress", "content": [], "role": "assistant"}
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
        where = {"item_id": item_id, "output_index": 0, "content_index": 0}
        yield (
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": 0, "item": item},
        )
        yield "response.content_part.added", {"type": "response.content_part.added", **where, "part": part}
        for word in text.split(" "):
            piece = word if word is text.split(" ")[0] else f" {word}"
            yield "response.output_text.delta", {"type": "response.output_text.delta", **where,
                                                 "delta": piece, "logprobs": []}  # fmt: skip
        yield "response.output_text.done", {"type": "response.output_text.done", **where, "text": text,
                                            "logprobs": []}  # fmt: skip
        full = part | {"text": text}
        yield "response.content_part.done", {"type": "response.content_part.done", **where, "part": full}
        done = item | {"status": "completed", "content": [full]}
        output_tokens = len(tokenize(text))
    yield "response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": done}
    usage = {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": input_tokens + output_tokens}  # fmt: skip
    final = head | {"status": "completed", "output": [done], "usage": usage}
    yield "response.completed", {"type": "response.completed", "response": final}


# --- Anthropic Messages ------------------------------------------------------------------------------------


def message_blocks(answer: Answer) -> list[dict[str, Any]]:
    if answer.tool_call:
        call = answer.tool_call
        return [{"type": "tool_use", "id": call["id"], "name": call["name"], "input": call["arguments"]}]
    return [{"type": "text", "text": answer.text or ""}]


def messages_events(answer: Answer, model: str, number: int, input_tokens: int) -> Iterator[tuple[str, dict]]:
    """The Messages stream: message_start, each block's start/deltas/stop, message_delta, message_stop."""
    usage = {"input_tokens": input_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
             "output_tokens": 1}  # fmt: skip
    message = {"id": f"msg_{number:024d}", "type": "message", "role": "assistant", "model": model,
               "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}  # fmt: skip
    yield "message_start", {"type": "message_start", "message": message}
    output_tokens = 0
    for index, block in enumerate(message_blocks(answer)):
        if block["type"] == "text":
            yield "content_block_start", {"type": "content_block_start", "index": index,
                                          "content_block": {"type": "text", "text": ""}}  # fmt: skip
            yield "ping", {"type": "ping"}
            delta = {"type": "text_delta", "text": block["text"]}
            output_tokens += len(tokenize(block["text"]))
        else:
            start = block | {"input": {}}
            yield (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
            partial = json.dumps(block["input"])
            delta = {"type": "input_json_delta", "partial_json": partial}
            output_tokens += len(tokenize(partial))
        yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    stop = "tool_use" if answer.tool_call else "end_turn"
    yield "message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                            "usage": {"output_tokens": output_tokens}}  # fmt: skip
    yield "message_stop", {"type": "message_stop"}


def message_response(answer: Answer, model: str, number: int, input_tokens: int) -> dict[str, Any]:
    stop = "tool_use" if answer.tool_call else "end_turn"
    output_tokens = sum(len(tokenize(json.dumps(block))) for block in message_blocks(answer))
    return {"id": f"msg_{number:024d}", "type": "message", "role": "assistant", "model": model,
            "content": message_blocks(answer), "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0, "output_tokens": output_tokens}}  # fmt: skip


class ScriptedCodingServer(FakeVLLM):
    """FakeVLLM (Chat Completions) plus `POST /v1/responses` and `POST /v1/messages`, all answering from one
    `CodingScript`; any model name is accepted (the CLIs send the one they were configured with)."""

    def __init__(self, model: str) -> None:
        self.coding = CodingScript()
        super().__init__(self.coding.chat_reply, model=model)
        self._numbers = iter(range(1, 1 << 30))

    def app(self) -> Starlette:
        app = super().app()
        app.router.routes += [
            Route("/v1/responses", self._responses, methods=["POST"]),
            Route("/v1/messages", self._messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
            Route("/", self._root, methods=["GET", "HEAD"]),
        ]
        return app

    async def _root(self, request: Request) -> Response:
        return Response(status_code=200)  # Claude Code checks the base URL with HEAD

    async def _body(self, request: Request) -> tuple[dict[str, Any], bytes]:
        raw = await request.body()
        body = json.loads(raw)
        self.requests.append(RecordedRequest(request.url.path, dict(request.headers), body))
        return body, raw

    async def _responses(self, request: Request) -> Response:
        body, raw = await self._body(request)
        items = body.get("input") if isinstance(body.get("input"), list) else []
        saw = any(str(item.get("type", "")).endswith("_output") for item in items if isinstance(item, dict))
        tools = [str(tool.get("name") or tool.get("type")) for tool in body.get("tools") or []]
        answer = self.coding.answer("responses", tools, saw, bool(body.get("stream")))
        events = list(responses_events(answer, str(body.get("model")), next(self._numbers), len(raw) // 4))
        for number, (_, data) in enumerate(events):
            data["sequence_number"] = number
        if not body.get("stream"):
            return JSONResponse(events[-1][1]["response"])
        return StreamingResponse(iter([sse(*event) for event in events]), media_type="text/event-stream")

    async def _messages(self, request: Request) -> Response:
        body, raw = await self._body(request)
        saw = any(
            isinstance(block, dict) and block.get("type") == "tool_result"
            for message in body.get("messages") or []
            for block in (message.get("content") if isinstance(message.get("content"), list) else [])
        )
        tools = [str(tool.get("name")) for tool in body.get("tools") or []]
        answer = self.coding.answer("messages", tools, saw, bool(body.get("stream")))
        model, number = str(body.get("model")), next(self._numbers)
        if not body.get("stream"):
            return JSONResponse(message_response(answer, model, number, len(raw) // 4))
        events = [sse(*event) for event in messages_events(answer, model, number, len(raw) // 4)]
        return StreamingResponse(iter(events), media_type="text/event-stream")

    async def _count_tokens(self, request: Request) -> Response:
        _, raw = await self._body(request)
        return JSONResponse({"input_tokens": len(raw) // 4})
