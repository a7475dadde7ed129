"""Responses API items: input items → chat messages, the model's output → output items and the response."""

import json
import uuid
from typing import Any

from otel_rl.gateway.protocols import ProtocolError

INPUT_ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")
PARTIAL = ("in_progress", "incomplete")  # a last assistant item with this status is continued
LOGPROBS_INCLUDE = "message.output_text.logprobs"


# ------------------------------------------------------------------ input


def input_messages(given: Any) -> tuple[list[dict[str, Any]], bool]:
    """The chat messages of `input`, and whether the last one is a partial assistant turn to continue.

    As vLLM builds them: a message item is one message; `function_call`, `reasoning` and assistant text
    items join the assistant message before them when it lacks that part (one model turn in the Responses
    API is several items); tool outputs are `tool` messages.
    """
    if isinstance(given, str):
        return [{"role": "user", "content": given}], False
    if not isinstance(given, list) or not given:
        raise ProtocolError("`input` must be a string or a non-empty list of items")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(given):
        if not isinstance(item, dict):
            raise ProtocolError(f"`input[{i}]` must be an object")
        _add_item(messages, item, f"input[{i}]")
    last = given[-1]
    continue_final = last.get("type", "message") in ("message", "reasoning") and last.get("status") in PARTIAL
    return messages, continue_final


def _add_item(messages: list[dict[str, Any]], item: dict[str, Any], where: str) -> None:
    kind = item.get("type", "message" if "role" in item else None)
    previous = messages[-1] if messages and messages[-1]["role"] == "assistant" else None
    if kind == "message":
        role = item.get("role")
        if role not in INPUT_ROLES:
            raise ProtocolError(f"`{where}.role` must be one of {', '.join(INPUT_ROLES)}")
        if role == "assistant":
            text = _assistant_text(item.get("content"), where)
            if previous is not None and previous.get("content") is None:
                previous["content"] = text
            else:
                messages.append({"role": "assistant", "content": text})
        else:
            messages.append({"role": role, "content": _content(item.get("content"), f"{where}.content")})
    elif kind in ("function_call", "custom_tool_call"):
        call_id, name = _string(item, "call_id", where), _string(item, "name", where)
        if kind == "custom_tool_call":  # vLLM's function shim for freeform tools: {"input": text}
            arguments = json.dumps({"input": _string(item, "input", where, empty=True)}, ensure_ascii=False)
        else:
            arguments = _string(item, "arguments", where, empty=True)
            if item.get("namespace"):
                name = f"{item['namespace']}__{name}"
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        if previous is not None:
            previous.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "tool_calls": [call]})
    elif kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        content = output if isinstance(output, str) else _content(output, f"{where}.output")
        messages.append({"role": "tool", "content": content, "tool_call_id": _string(item, "call_id", where)})
    elif kind == "reasoning":
        if item.get("encrypted_content"):
            raise ProtocolError(f"`{where}.encrypted_content` is not supported: only OpenAI can read it")
        # The reasoning text goes to the chat template, which decides whether the model sees it again (most
        # drop the reasoning of earlier turns): the prompt is then what the model would render itself.
        text = _joined(item.get("content"), where) or _joined(item.get("summary"), where)
        if previous is not None and previous.get("reasoning") is None:
            previous["reasoning"] = text
        else:
            messages.append({"role": "assistant", "reasoning": text})
    else:
        raise ProtocolError(
            f"`{where}.type` {json.dumps(kind)} is not supported: send message, function_call, "
            "function_call_output, custom_tool_call, custom_tool_call_output or reasoning items"
        )


def _content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A message's content as chat content: text parts become `text` parts, images `image_url` parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ProtocolError(f"`{where}` must be a string or a list of content parts")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS:
            parts.append({"type": "text", "text": _string(part, "text", f"{where}[{j}]", empty=True)})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise ProtocolError(
                f"`{where}[{j}]` must be an input_text, output_text or input_image (with image_url) part"
            )
    return parts


def _assistant_text(content: Any, where: str) -> str:
    """An assistant message's text: all its text parts, joined (vLLM keeps the first part only)."""
    if isinstance(content, str):
        return content
    parts = _content(content, f"{where}.content")
    return "".join(part.get("text", "") for part in parts)


def _joined(parts: Any, where: str) -> str:
    if parts is None:
        return ""
    if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
        raise ProtocolError(f"`{where}` content and summary must be lists of parts")
    return "".join(str(part.get("text") or "") for part in parts)


def _string(item: dict[str, Any], field: str, where: str, *, empty: bool = False) -> str:
    value = item.get(field)
    if not isinstance(value, str) or not (value or empty):
        raise ProtocolError(f"`{where}.{field}` must be a {'' if empty else 'non-empty '}string")
    return value


# ------------------------------------------------------------------ output


def call_id_suffix(chat_id: Any) -> str:
    """The id part shared by a response and its items, from vLLM's `chatcmpl-...` id."""
    suffix = str(chat_id or "").removeprefix("chatcmpl-")
    return suffix or uuid.uuid4().hex


def custom_tool_names(tools: Any) -> frozenset[str]:
    return frozenset(
        tool.get("name") for tool in tools or () if isinstance(tool, dict) and tool.get("type") == "custom"
    )


def function_tool_names(tools: Any) -> dict[str, tuple[str, str]]:
    """The flat names of namespaced functions (`namespace__name`) → (namespace, name)."""
    names = {}
    for tool in tools or ():
        if isinstance(tool, dict) and tool.get("type") == "namespace":
            for member in tool.get("tools") or ():
                if isinstance(member, dict) and member.get("type") == "function":
                    names[f"{tool.get('name')}__{member.get('name')}"] = (
                        tool.get("name"),
                        member.get("name"),
                    )
    return names


def message_item(
    item_id: str, text: str, logprobs: list[dict[str, Any]] | None, status: str
) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
    content = [part] if status == "completed" else []
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def tool_call_item(
    item_id: str,
    call_id: str,
    name: str,
    arguments: str,
    status: str,
    *,
    custom_tools: frozenset[str],
    namespaced: dict[str, tuple[str, str]],
) -> dict[str, Any]:
    """A `function_call` item, or a `custom_tool_call` one when `name` is a custom tool's."""
    if name in custom_tools:
        return {
            "id": item_id.replace("fc_", "ctc_", 1),
            "type": "custom_tool_call",
            "call_id": call_id,
            "name": name,
            "input": custom_tool_input(arguments) if status == "completed" else "",
            "status": status,
        }
    item = {"id": item_id, "type": "function_call", "call_id": call_id, "name": name}
    if name in namespaced:
        item["namespace"], item["name"] = namespaced[name]
    item.update(arguments=arguments, status=status)
    return item


def custom_tool_input(arguments: str) -> str:
    """The text a model gave a custom tool through its function shim (bare text passes as it is)."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    value = parsed.get("input") if isinstance(parsed, dict) else None
    return value if isinstance(value, str) else arguments


def output_items(
    suffix: str,
    *,
    reasoning: str | None,
    text: str | None,
    logprobs: list[dict[str, Any]] | None,
    tool_calls: list[tuple[str | None, str, str]],
    custom_tools: frozenset[str],
    namespaced: dict[str, tuple[str, str]],
) -> list[dict[str, Any]]:
    """A non-streamed turn's items: reasoning, then the message, then the tool calls (vLLM's order)."""
    items = []
    if reasoning:
        items.append(reasoning_item(f"rs_{suffix}", reasoning, "completed"))
    if text:
        items.append(message_item(f"msg_{suffix}", text, logprobs, "completed"))
    for i, (call_id, name, arguments) in enumerate(tool_calls):
        items.append(
            tool_call_item(
                f"fc_{suffix}_{i}",
                call_id or f"call_{suffix}_{i}",
                name,
                arguments,
                "completed",
                custom_tools=custom_tools,
                namespaced=namespaced,
            )
        )
    return items


def response_object(
    request: dict[str, Any],
    *,
    response_id: str,
    created_at: Any,
    model: Any,
    output: list[dict[str, Any]],
    status: str,
    usage: dict[str, Any] | None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `response` object, echoing the client's settings as OpenAI does."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": request.get("reasoning"),
        "store": False,
        "temperature": request.get("temperature"),
        "text": request.get("text") or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p"),
        "truncation": "disabled",
        "usage": responses_usage(usage) if usage else None,
        "metadata": request.get("metadata"),
    }


def status_of(finish_reason: str | None) -> str:
    """A turn cut by `max_output_tokens` is incomplete; any other end is complete."""
    return "incomplete" if finish_reason == "length" else "completed"


def responses_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """Chat usage in the Responses shape (what Codex reads: input, output and total tokens)."""
    input_tokens = usage.get("prompt_tokens") or 0
    output_tokens = usage.get("completion_tokens") or 0
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        },
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.get("total_tokens") or input_tokens + output_tokens,
    }


def wants_logprobs(body: dict[str, Any]) -> bool:
    include = body.get("include")
    if include is not None and not (isinstance(include, list) and all(isinstance(i, str) for i in include)):
        raise ProtocolError("`include` must be a list of strings")
    return LOGPROBS_INCLUDE in (include or ())


def responses_logprob(entry: dict[str, Any]) -> dict[str, Any]:
    """A chat logprob entry in the Responses shape (vLLM floors -inf at -9999 there)."""
    return {
        "token": entry.get("token"),
        "logprob": max(entry.get("logprob", -9999.0), -9999.0),
        "bytes": entry.get("bytes") or [],
        "top_logprobs": [
            {
                "token": top.get("token"),
                "logprob": max(top.get("logprob", -9999.0), -9999.0),
                "bytes": top.get("bytes") or [],
            }
            for top in entry.get("top_logprobs") or ()
        ],
    }
