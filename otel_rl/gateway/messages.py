"""Anthropic Messages (`POST /v1/messages`, Claude Code's API) translated to and from Chat Completions.

The mapping is vLLM 0.32's own (`vllm/entrypoints/anthropic/serving.py`), so that a call through the
gateway renders the same prompt and gives the client the same content as vLLM's `/v1/messages` would, while
the gateway sends vLLM's `/v1/chat/completions`, which returns the exact token ids to record.
"""

import json
import uuid
from typing import Any

import orjson

from otel_rl.gateway.messages_stream import Stream, error_body, stop_reason_of, usage_of
from otel_rl.gateway.protocols import ProtocolError

__all__ = ["API", "Stream", "chat_request", "count_tokens_request", "error_body", "response_body"]

API = "messages"

# Claude Code's system block with a per-request hash: vLLM drops it, as it defeats the prefix cache.
BILLING_HEADER = "x-anthropic-billing-header"
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
MIN_THINKING_BUDGET = 1024  # Anthropic's (and vLLM's) lower bound for `thinking.budget_tokens`


def chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """A Messages request → the Chat Completions request vLLM's own `/v1/messages` would render."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ProtocolError("model: a model name is required")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0:
        raise ProtocolError("max_tokens: a positive integer is required")
    messages = _list(body, "messages", required=True)
    chat_messages = _system(body.get("system"))
    for i, message in enumerate(messages):
        _add_message(chat_messages, message, f"messages[{i}]")
    chat: dict[str, Any] = {"model": model, "messages": chat_messages, "max_tokens": max_tokens}
    chat["max_completion_tokens"] = max_tokens
    stop = _list(body, "stop_sequences")
    if stop is not None:
        if not all(isinstance(s, str) for s in stop):
            raise ProtocolError("stop_sequences: a list of strings is required")
        chat["stop"] = stop
    for name in ("temperature", "top_p", "top_k"):
        value = body.get(name)
        if value is not None:
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ProtocolError(f"{name}: a number is required")
            chat[name] = value
    if body.get("stream"):
        chat["stream"] = True
        # The final message_delta carries usage; message_start carries the prompt's, from the first chunk.
        chat["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    _thinking(body.get("thinking"), max_tokens, chat)
    _tools(body, chat)
    return chat


def count_tokens_request(body: dict[str, Any]) -> dict[str, Any]:
    """A count_tokens request → vLLM's `/tokenize` request for the same rendered prompt (`thinking` is not
    rendered: it only bounds or switches off what the model samples)."""
    chat = chat_request({**body, "max_tokens": 1, "stream": False, "thinking": None})
    tokenize = {"model": chat["model"], "messages": chat["messages"], "add_generation_prompt": True}
    if "tools" in chat:
        tokenize["tools"] = chat["tools"]
    return tokenize


def _list(body: dict[str, Any], name: str, *, required: bool = False) -> list[Any] | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, list):
        raise ProtocolError(f"{name}: a list is required")
    return value


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    if not isinstance(system, list):
        raise ProtocolError("system: a string or a list of text blocks is required")
    text = "".join(_block_texts(system, "system"))
    return [{"role": "system", "content": text}] if text else []


def _block_texts(blocks: list[Any], where: str) -> list[str]:
    texts = []
    for j, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise ProtocolError(f"{where}[{j}]: only text blocks are allowed here")
        text = block.get("text")
        if not isinstance(text, str):
            raise ProtocolError(f"{where}[{j}].text: a string is required")
        if text and not text.startswith(BILLING_HEADER):
            texts.append(text)
    return texts


def _add_message(chat_messages: list[dict[str, Any]], message: Any, where: str) -> None:
    if not isinstance(message, dict):
        raise ProtocolError(f"{where}: an object is required")
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant", "system"):
        raise ProtocolError(f"{where}.role: 'user' or 'assistant' is required, not {role!r}")
    if role == "system":  # not Anthropic's, but vLLM accepts it: Claude Code's reminders, some proxies
        text = content if isinstance(content, str) else "".join(_block_texts(_blocks(content, where), where))
        if text and not text.startswith(BILLING_HEADER):
            chat_messages.append({"role": "system", "content": text})
        return
    if isinstance(content, str):
        chat_messages.append({"role": role, "content": content})
        return
    converted: dict[str, Any] = {"role": role}
    parts: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for j, block in enumerate(_blocks(content, where)):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise ProtocolError(f"{at}.text: a string is required")
            if block["text"]:
                parts.append({"type": "text", "text": block["text"]})
        elif kind == "thinking":
            if isinstance(block.get("thinking"), str):
                reasoning.append(block["thinking"])
        elif kind == "redacted_thinking":
            pass  # opaque to any model but Anthropic's: accepted so that clients can echo the turn back
        elif kind == "tool_use" and role == "assistant":
            tool_calls.append(_tool_call(block, at))
        elif kind == "tool_result" and role == "user":
            # A tool message of its own, where the result appears among the user's blocks (vLLM's order).
            chat_messages.append(_tool_message(block, at))
        elif kind == "image":
            raise ProtocolError(f"{at}: image blocks are not supported by this gateway (text models only)")
        else:
            raise ProtocolError(f"{at}.type: {kind!r} blocks are not allowed in a {role} message")
    if reasoning:
        converted["reasoning"] = "".join(reasoning)
    if tool_calls:
        converted["tool_calls"] = tool_calls
    if parts:
        converted["content"] = parts[0]["text"] if len(parts) == 1 else parts
    # A user turn of tool results only is its tool messages; an empty assistant turn stays (vLLM's choice).
    if role == "assistant" or "content" in converted:
        chat_messages.append(converted)


def _blocks(content: Any, where: str) -> list[Any]:
    if not isinstance(content, list):
        raise ProtocolError(f"{where}.content: a string or a list of content blocks is required")
    return content


def _tool_call(block: dict[str, Any], at: str) -> dict[str, Any]:
    name, arguments = block.get("name"), block.get("input") or {}
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"{at}.name: the tool's name is required")
    if not isinstance(arguments, dict):
        raise ProtocolError(f"{at}.input: an object is required")
    call_id = block.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise ProtocolError(f"{at}.id: the tool_use id is required (tool_result blocks refer to it)")
    # json.dumps, not orjson: its spacing is what vLLM's own conversion renders into the prompt.
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _tool_message(block: dict[str, Any], at: str) -> dict[str, Any]:
    tool_use_id, content = block.get("tool_use_id"), block.get("content")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise ProtocolError(f"{at}.tool_use_id: the id of the tool_use block it answers is required")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for k, item in enumerate(content):
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "image":
                raise ProtocolError(f"{at}.content[{k}]: image blocks are not supported by this gateway")
            if kind != "text" or not isinstance(item.get("text"), str):
                raise ProtocolError(f"{at}.content[{k}]: a text block is required")
            texts.append(item["text"])  # empty ones too: vLLM joins every text block
        text = "\n".join(texts)
    else:
        raise ProtocolError(f"{at}.content: a string or a list of text blocks is required")
    # `is_error` is not rendered: vLLM's chat templates have no place for it (the text says what failed).
    return {"role": "tool", "tool_call_id": tool_use_id, "content": text}


def _thinking(thinking: Any, max_tokens: int, chat: dict[str, Any]) -> None:
    """Extended thinking, as vLLM maps it: a budget for the model's reasoning, or reasoning switched off."""
    if thinking is None:
        return
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or not MIN_THINKING_BUDGET <= budget < max_tokens:
            raise ProtocolError(
                f"thinking.budget_tokens: an integer ≥ {MIN_THINKING_BUDGET} and < max_tokens is required"
            )
        chat["thinking_token_budget"] = budget
    elif kind == "disabled":
        chat["reasoning_effort"] = "none"
    elif kind != "adaptive":  # adaptive: the model decides, nothing to pin
        raise ProtocolError("thinking.type: 'enabled', 'disabled' or 'adaptive' is required")


def _tools(body: dict[str, Any], chat: dict[str, Any]) -> None:
    choice = body.get("tool_choice")
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind == "tool":
            if not isinstance(choice.get("name"), str) or not choice["name"]:
                raise ProtocolError("tool_choice.name: required when type is 'tool'")
            chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        elif kind in TOOL_CHOICES:
            chat["tool_choice"] = TOOL_CHOICES[kind]
        else:
            raise ProtocolError("tool_choice.type: 'auto', 'any', 'tool' or 'none' is required")
        chat["parallel_tool_calls"] = not choice.get("disable_parallel_tool_use")
    tools = _list(body, "tools")
    if tools is None:
        return
    chat["tools"] = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
    chat.setdefault("tool_choice", "auto")


def _tool(tool: Any, at: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"]:
        raise ProtocolError(f"{at}.name: the tool's name is required")
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        raise ProtocolError(f"{at}.input_schema: a JSON schema object is required")
    parameters = dict(schema)
    parameters.setdefault("type", "object")  # at the end, where vLLM adds it: the template renders key order
    function: dict[str, Any] = {"name": tool["name"], "parameters": parameters}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    if tool.get("strict") is not None:
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


# ------------------------------------------------------------------ responses


def response_body(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """vLLM's `chat.completion` → the Messages response (one choice: Messages has no `n`)."""
    choice = chat["choices"][0]
    message = choice.get("message") or {}
    tool_calls = message.get("tool_calls") or []
    stop_reason, stop_sequence = stop_reason_of(
        choice.get("finish_reason"), choice.get("stop_reason"), tool_used=bool(tool_calls), tool_complete=True
    )
    content: list[dict[str, Any]] = []
    if message.get("reasoning"):
        content.append({"type": "thinking", "thinking": message["reasoning"], "signature": uuid.uuid4().hex})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in tool_calls:
        function = call.get("function") or {}
        arguments = _tool_input(function.get("arguments") or "{}")
        content.append(
            {"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": arguments}
        )
    response: dict[str, Any] = {
        "id": chat.get("id"),
        "type": "message",
        "role": "assistant",
        "content": content or [{"type": "text", "text": ""}],  # Anthropic's shape of an empty answer
        "model": chat.get("model"),
    }
    if stop_reason is not None:
        response["stop_reason"] = stop_reason
    if stop_sequence is not None:
        response["stop_sequence"] = stop_sequence
    response["usage"] = usage_of(chat.get("usage"))
    return response


def _tool_input(arguments: str) -> dict[str, Any]:
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        raise ProtocolError(f"the model's tool call arguments are not JSON: {arguments[:200]!r}") from None
    if not isinstance(parsed, dict):
        raise ProtocolError(f"the model's tool call arguments are not a JSON object: {arguments[:200]!r}")
    return parsed
