"""The OpenAI Responses API (`POST /v1/responses`, Codex CLI's) as Chat Completions requests and responses.

The gateway keeps no state: `previous_response_id`, `conversation` and `background` are refused; a client
sends the whole conversation as `input` each time (Codex does, with `store: false`). The mapping of input
items to chat messages, and of the model's output to output items, is vLLM 0.32's own for `/v1/responses`
on a chat-template model (`vllm/entrypoints/openai/responses/utils.py`; one deviation: an assistant message
keeps all its text parts, where vLLM keeps the first), so that a client gets the same content from the
gateway as from vLLM's endpoint, while vLLM's `/v1/chat/completions` returns the exact prompt and completion
token ids and every token's logprob (vLLM's `/v1/responses` has no logprobs for a turn of tool calls).
"""

import json
from typing import Any

import orjson

from otel_rl.gateway.protocols import ProtocolError
from otel_rl.gateway.responses_items import (
    call_id_suffix,
    custom_tool_names,
    function_tool_names,
    input_messages,
    output_items,
    response_object,
    responses_logprob,
    status_of,
    wants_logprobs,
)
from otel_rl.gateway.responses_stream import Stream

__all__ = ["API", "Stream", "chat_request", "error_body", "response_body"]

API = "responses"

# vLLM-specific sampling fields that its `/v1/responses` also accepts: passed on as they are.
VLLM_SAMPLING = (
    "top_k",
    "min_p",
    "repetition_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "structured_outputs",
)
# A custom (freeform) tool is shown to the model as a function of one string, as vLLM shows it.
CUSTOM_TOOL_PARAMETERS = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The freeform text payload for this tool."}},
    "required": ["input"],
    "additionalProperties": False,
}


def chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request → the Chat Completions request vLLM renders the same way."""
    for field in ("previous_response_id", "conversation"):
        if body.get(field) is not None:
            raise ProtocolError(
                f"`{field}` is not supported: the gateway keeps no responses; send the whole conversation "
                "as `input` (with `store: false`)"
            )
    if body.get("background"):
        raise ProtocolError("`background` is not supported: the gateway keeps no responses")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ProtocolError("`model` must be a non-empty string")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ProtocolError("`instructions` must be a string")
    messages, continue_final = input_messages(body.get("input"))
    if instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    chat: dict[str, Any] = {"model": model, "messages": messages}
    if continue_final:  # a partial assistant message at the end is continued, not answered
        chat["add_generation_prompt"] = False
        chat["continue_final_message"] = True
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("parallel_tool_calls") is not None:
        chat["parallel_tool_calls"] = _typed(body, "parallel_tool_calls", bool)
    for field, chat_field in (("temperature", "temperature"), ("top_p", "top_p")):
        if body.get(field) is not None:
            chat[chat_field] = _typed(body, field, int | float)
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = _positive(body, "max_output_tokens")
    for field in VLLM_SAMPLING:
        if body.get(field) is not None:
            chat[field] = body[field]
    if wants_logprobs(body):
        chat["logprobs"] = True
        if body.get("top_logprobs"):
            chat["top_logprobs"] = _typed(body, "top_logprobs", int)
    effort = (_object(body, "reasoning") or {}).get("effort")
    if effort is not None:
        chat["reasoning_effort"] = effort
    response_format = _response_format(_object(body, "text"))
    if response_format is not None:
        chat["response_format"] = response_format
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def response_body(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """vLLM's `chat.completion` → the Responses object for the client's `request`."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    logprobs = None
    if wants_logprobs(request):
        logprobs = [responses_logprob(entry) for entry in (choice.get("logprobs") or {}).get("content") or ()]
    suffix = call_id_suffix(chat.get("id"))
    items = output_items(
        suffix,
        reasoning=message.get("reasoning") or message.get("reasoning_content"),
        text=message.get("content"),
        logprobs=logprobs,
        tool_calls=[
            (call.get("id"), call["function"].get("name") or "", call["function"].get("arguments") or "")
            for call in message.get("tool_calls") or ()
            if isinstance(call.get("function"), dict)
        ],
        custom_tools=custom_tool_names(request.get("tools")),
        namespaced=function_tool_names(request.get("tools")),
    )
    return response_object(
        request,
        response_id=f"resp_{suffix}",
        created_at=chat.get("created"),
        model=chat.get("model"),
        output=items,
        status=status_of(choice.get("finish_reason")),
        usage=chat.get("usage"),
    )


def error_body(status: int, message: str, error_type: str) -> bytes:
    """OpenAI's error body; `code` is a string or null (Codex reads it as a string)."""
    return orjson.dumps({"error": {"message": message, "type": error_type, "param": None, "code": None}})


# ------------------------------------------------------------------ request fields


def _tools(tools: Any) -> list[dict[str, Any]]:
    """Function tools as chat tools; custom tools as a one-string function (vLLM's shim); namespaces
    flattened to `namespace__name`. Hosted tools (web_search, local_shell, file_search, ...) are dropped:
    no model behind vLLM can run them, and vLLM drops them too."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ProtocolError("`tools` must be a list")
    converted = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise ProtocolError(f"`tools[{i}]` must be an object with a `type`")
        if tool["type"] == "function":
            converted.append(_function_tool(tool, f"tools[{i}]"))
        elif tool["type"] == "custom":
            custom = {**tool, "parameters": CUSTOM_TOOL_PARAMETERS}
            converted.append(_function_tool(custom, f"tools[{i}]"))
        elif tool["type"] == "namespace":
            for j, member in enumerate(tool.get("tools") or ()):
                if isinstance(member, dict) and member.get("type") == "function":
                    flat = {**member, "name": f"{tool.get('name')}__{member.get('name')}"}
                    converted.append(_function_tool(flat, f"tools[{i}].tools[{j}]"))
    return converted


def _function_tool(tool: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise ProtocolError(f"`{where}.name` must be a non-empty string")
    if tool.get("parameters") is not None and not isinstance(tool["parameters"], dict):
        raise ProtocolError(f"`{where}.parameters` must be a JSON schema object")
    function = {"name": tool["name"]}
    for field in ("description", "parameters", "strict"):
        if tool.get(field) is not None:
            function[field] = tool[field]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        if not isinstance(choice.get("name"), str):
            raise ProtocolError("`tool_choice.name` must be a string")
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ProtocolError(
        "`tool_choice` must be `auto`, `none`, `required` or {`type`: `function`, `name`: ...}"
    )


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` as a chat `response_format` (`text.verbosity` is tolerated: no model here reads it)."""
    form = (text or {}).get("format")
    if form is None or form.get("type") == "text":
        return None
    if form.get("type") == "json_object":
        return {"type": "json_object"}
    if form.get("type") == "json_schema":
        schema = {key: form[key] for key in ("name", "schema", "strict", "description") if key in form}
        return {"type": "json_schema", "json_schema": schema}
    raise ProtocolError("`text.format.type` must be `text`, `json_object` or `json_schema`")


def _object(body: dict[str, Any], field: str) -> dict[str, Any] | None:
    value = body.get(field)
    if value is not None and not isinstance(value, dict):
        raise ProtocolError(f"`{field}` must be an object")
    return value


def _typed(body: dict[str, Any], field: str, kind: Any) -> Any:
    value = body[field]
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ProtocolError(f"`{field}` has the wrong type: {json.dumps(value)[:100]}")
    return value


def _positive(body: dict[str, Any], field: str) -> int:
    value = _typed(body, field, int)
    if value < 1:
        raise ProtocolError(f"`{field}` must be at least 1")
    return value
