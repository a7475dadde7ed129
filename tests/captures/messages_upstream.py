"""The capture scenarios' scripted upstream, which speaks Anthropic Messages too (unstreamed).

A Messages request is read as the Chat Completions request it stands for (roles, tool names, stream flag),
answered by the same scripted replies, and the reply is written back as Messages content blocks: text, then
one `tool_use` block per tool call.
"""

from __future__ import annotations

import json
from typing import Any

from fake_vllm import FakeVLLM, error_body
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """The Chat Completions request a Messages request stands for, as far as expected.json records it."""
    messages = [{"role": "system", "content": body["system"]}] if body.get("system") else []
    for message in body.get("messages") or []:
        blocks = message.get("content") if isinstance(message.get("content"), list) else []
        results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
        if results:  # a user turn of tool results is one tool message per result
            messages += [{"role": "tool", "tool_call_id": r.get("tool_use_id")} for r in results]
        else:
            messages.append({"role": message.get("role")})
    tools = [{"type": "function", "function": {"name": t.get("name")}} for t in body.get("tools") or []]
    return {"messages": messages, "tools": tools, "stream": bool(body.get("stream")),
            "max_tokens": body.get("max_tokens")}  # fmt: skip


class MessagesUpstream(FakeVLLM):
    """FakeVLLM (Chat Completions) plus non-streamed Anthropic Messages, from one script of replies."""

    def app(self) -> Starlette:
        app = super().app()
        app.router.routes.append(Route("/v1/messages", self._messages, methods=["POST"]))
        return app

    async def _messages(self, request: Request) -> Response:
        body, _, early = await self._receive(request, "messages")
        if early is not None:
            return early
        if body.get("stream"):
            return JSONResponse(error_body(400, "the capture upstream answers Messages unstreamed"), 400)
        number = next(self._ids)
        try:
            [choice] = self._choices(chat_request(body), True, number)
        except LookupError as exc:
            return JSONResponse(error_body(500, str(exc)), status_code=500)
        blocks: list[dict[str, Any]] = [{"type": "text", "text": choice.content}] if choice.content else []
        blocks += [
            {"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
             "input": json.loads(call["function"]["arguments"])}
            for call in choice.tool_calls
        ]  # fmt: skip
        stop = "tool_use" if choice.tool_calls else "end_turn"
        usage = {"input_tokens": len(json.dumps(body)) // 4, "output_tokens": len(choice.token_ids)}
        return JSONResponse({"id": f"msg_{number:024d}", "type": "message", "role": "assistant",
                             "model": body["model"], "content": blocks, "stop_reason": stop,
                             "stop_sequence": None, "usage": usage})  # fmt: skip
