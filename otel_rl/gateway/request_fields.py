"""Every request field of each API the gateway serves, with its bound or the reason it needs none.

Chat Completions and Completions bodies are forwarded to vLLM as they are, so their tables hold every field
of vLLM's request models and of OpenAI's; Messages and Responses are translated, so theirs hold every field
the translation reads and every field of the official SDKs' request types (most of which it ignores).
`tests/test_gateway_limits.py` fails when either side gains a field these tables do not classify.
"""

from typing import Any

from otel_rl.gateway.limits import (
    Fields,
    MediaBudget,
    RequestLimits,
    RequestRefused,
    check_fields,
    count,
    integer,
    over,
    refused,
    schema,
    stop_strings,
)

TEXT_PARTS = ("text", "input_text", "output_text", "refusal", "thinking", "tool_reference")
# A media part's type → the key holding its URL (an object with `url`, or the URL itself: input_image).
URL_PARTS = {
    "image_url": "image_url",
    "input_image": "image_url",
    "audio_url": "audio_url",
    "video_url": "video_url",
}

NUMBER = "a number or a flag: what it costs does not depend on its value"
NAME = "a short string, echoed or hashed; bounded by the request body"
TEXT = "text rendered into the prompt once; bounded by the request body (max_request_bytes)"
IGNORED = "not read: vLLM ignores it (an OpenAI or Anthropic feature vLLM lacks)"
NOT_TRANSLATED = "not read: the gateway's translation ignores it"
REMOTE = "it names hosts that vLLM would connect to for the caller"
MEDIA_DECODING = "it changes how vLLM decodes media; only the admin sets that, on vLLM"


def _free(reason: str, *names: str) -> Fields:
    return dict.fromkeys(names, reason)


# ------------------------------------------------------------------ structure walkers


def chat_messages(value: Any, where: str, limits: RequestLimits) -> None:
    """Chat messages: counted, their parts and tool calls counted together, each media part checked."""
    count("max_messages")(value, where, limits)
    if not isinstance(value, list):
        return
    budget = MediaBudget(limits)
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            continue
        content, calls = message.get("content"), message.get("tool_calls")
        if isinstance(content, list):
            budget.add_parts(len(content), f"{where}[{i}].content")
            for j, part in enumerate(content):
                _chat_part(part, f"{where}[{i}].content[{j}]", budget)
        if isinstance(calls, list):
            budget.add_parts(len(calls), f"{where}[{i}].tool_calls")


def _chat_part(part: Any, where: str, budget: MediaBudget) -> None:
    """A part as vLLM parses it (a string is text); media by URL or inline data, nothing else."""
    if not isinstance(part, dict):
        return  # a string is text; anything else vLLM refuses
    kind = part.get("type")
    if part.get("uuid") is not None:
        raise RequestRefused(f"`{where}.uuid` is not accepted: it names media cached by vLLM for others")
    if kind in TEXT_PARTS:
        return
    if kind in URL_PARTS:
        url = part.get(URL_PARTS[kind])
        budget.media_url(url.get("url") if isinstance(url, dict) else url, f"{where}.{URL_PARTS[kind]}")
    elif kind == "input_audio":
        budget.media_part(where)
        audio = part.get("input_audio")
        budget.data(audio.get("data") if isinstance(audio, dict) else None, f"{where}.input_audio.data")
    else:
        raise RequestRefused(
            f"`{where}.type` {kind!r} is not accepted by this gateway: send text parts, or media as "
            f"{', '.join(sorted(URL_PARTS))} or input_audio parts"
        )


def anthropic_messages(value: Any, where: str, limits: RequestLimits) -> None:
    """Messages: counted, their blocks and tool results' blocks counted together (images are refused by
    the translation, which fetches nothing)."""
    count("max_messages")(value, where, limits)
    if not isinstance(value, list):
        return
    budget = MediaBudget(limits)
    for i, message in enumerate(value):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        budget.add_parts(len(content), f"{where}[{i}].content")
        for j, block in enumerate(content):
            inner = block.get("content") if isinstance(block, dict) else None
            if isinstance(inner, list):
                budget.add_parts(len(inner), f"{where}[{i}].content[{j}].content")


def responses_input(value: Any, where: str, limits: RequestLimits) -> None:
    """Responses input items: counted, their parts counted together, image URLs checked, files refused."""
    count("max_messages")(value, where, limits)
    if not isinstance(value, list):
        return
    budget = MediaBudget(limits)
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            continue
        for key in ("content", "output", "summary"):
            parts = item.get(key)
            if not isinstance(parts, list):
                continue
            budget.add_parts(len(parts), f"{where}[{i}].{key}")
            for j, part in enumerate(parts):
                kind = part.get("type") if isinstance(part, dict) else None
                at = f"{where}[{i}].{key}[{j}]"
                if kind == "input_image":
                    budget.media_url(part.get("image_url"), f"{at}.image_url")
                elif kind == "input_file":
                    raise RequestRefused(
                        f"`{at}`: input_file parts are not accepted: the gateway reads no file or URL for a "
                        "caller (send the file's text as input_text)"
                    )


def responses_tools(value: Any, where: str, limits: RequestLimits) -> None:
    """Responses tools, a namespace counting its functions."""
    count("max_tools")(value, where, limits)
    if not isinstance(value, list):
        return
    members = [t.get("tools") for t in value if isinstance(t, dict) and t.get("type") == "namespace"]
    total = len(value) + sum(len(m) for m in members if isinstance(m, list))
    if total > limits.max_tools:
        raise over(where, f"has {total} tools", "max_tools", limits)


def thinking(value: Any, where: str, limits: RequestLimits) -> None:
    if isinstance(value, dict):
        integer("max_tokens")(value.get("budget_tokens"), f"{where}.budget_tokens", limits)


def template_kwargs(value: Any, where: str, limits: RequestLimits) -> None:
    """Arguments of the model's own chat template (`enable_thinking`), never a template of its own."""
    if isinstance(value, dict) and "chat_template" in value:
        raise RequestRefused(
            f"`{where}.chat_template` is not accepted: the model's own template renders calls"
        )


# ------------------------------------------------------------------ the tables

# vLLM's sampling and output fields, read the same way by Chat Completions and Completions.
VLLM_SAMPLING: Fields = {
    "model": "a name (the gateway sends the policy's for a LoRA policy)",
    **_free(NUMBER, "frequency_penalty", "presence_penalty", "temperature", "top_p", "top_k", "min_p"),
    **_free(NUMBER, "repetition_penalty", "length_penalty", "seed", "stream", "ignore_eos", "echo"),
    **_free(NUMBER, "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens"),
    **_free(NUMBER, "watermarking", "return_tokens_as_token_ids", "return_token_ids", "return_token_offsets"),
    **_free(NUMBER, "add_special_tokens", "truncation_side", "mm_payload", "return_mm_kwargs"),
    **_free(NUMBER, "routed_experts_prompt_start", "stream_interval", "stream_options"),
    "use_beam_search": "a flag: the beams are the `n` choices, bounded by max_n",
    "priority": "a number; vLLM refuses it unless the admin started vLLM with priority scheduling",
    "truncate_prompt_tokens": "it only shortens the prompt",
    **_free(NAME, "user", "request_id", "session_id", "cache_salt"),
    "n": integer("max_n"),
    "best_of": integer("max_n"),  # OpenAI's Completions field; vLLM 0.32 does not read it
    "max_tokens": integer("max_tokens"),
    "min_tokens": integer("max_tokens"),
    "thinking_token_budget": integer("max_tokens"),
    "prompt_logprobs": integer("max_logprobs"),  # -1 (every token of the vocabulary) is refused
    "logprob_token_ids": count("max_logprobs"),
    "stop": stop_strings,
    "bad_words": stop_strings,
    "stop_token_ids": count("max_token_ids"),
    "allowed_token_ids": count("max_token_ids"),
    "logit_bias": count("max_token_ids"),
    "response_format": schema,
    "structured_outputs": schema,
    "vllm_xargs": "arguments of custom logits processors, which only the admin installs in vLLM",
    "kv_transfer_params": refused(REMOTE),
    "ec_transfer_params": refused(REMOTE),
    "repetition_detection": refused("its cost per generated token grows with the output"),
}

CHAT_COMPLETIONS: Fields = {
    **VLLM_SAMPLING,
    "messages": chat_messages,
    "tools": count("max_tools"),
    "documents": count("max_messages"),
    "max_completion_tokens": integer("max_tokens"),
    "top_logprobs": integer("max_logprobs"),
    "logprobs": "a flag in Chat Completions (top_logprobs says how many)",
    **_free(NUMBER, "parallel_tool_calls", "reasoning_effort", "include_reasoning", "add_generation_prompt"),
    **_free(NUMBER, "continue_final_message", "return_prompt_text"),
    "tool_choice": "names one of the tools",
    "chat_template": refused("a template is code vLLM would run; the model's own template renders calls"),
    "chat_template_kwargs": template_kwargs,
    "media_io_kwargs": refused(MEDIA_DECODING),
    "mm_processor_kwargs": refused(MEDIA_DECODING),
    **_free(IGNORED, "audio", "function_call", "functions", "metadata", "modalities", "moderation"),
    **_free(IGNORED, "prediction", "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention"),
    **_free(IGNORED, "safety_identifier", "service_tier", "store", "verbosity", "web_search_options"),
}

COMPLETIONS: Fields = {
    **VLLM_SAMPLING,
    "prompt": count("max_prompt_tokens"),  # token ids; a string is bounded by the request body
    "logprobs": integer("max_logprobs"),
    "suffix": TEXT,
    "prompt_embeds": refused("tensors vLLM would decode; send text or token ids"),
}

MESSAGES: Fields = {
    "model": "a name",
    "max_tokens": integer("max_tokens"),
    "messages": anthropic_messages,
    "system": count("max_content_parts"),
    "stop_sequences": stop_strings,
    "thinking": thinking,
    "tools": count("max_tools"),
    "tool_choice": "names one of the tools",
    **_free(NUMBER, "temperature", "top_p", "top_k", "stream"),
    **_free(NOT_TRANSLATED, "cache_control", "container", "diagnostics", "inference_geo", "metadata"),
    **_free(NOT_TRANSLATED, "output_config", "service_tier", "speed", "user_profile_id", "workspace_id"),
    "mcp_servers": NOT_TRANSLATED + " (no MCP server is ever called)",
}

RESPONSES: Fields = {
    "model": "a name",
    "input": responses_input,
    "instructions": TEXT,
    "tools": responses_tools,
    "tool_choice": "names one of the tools",
    "max_output_tokens": integer("max_tokens"),
    "top_logprobs": integer("max_logprobs"),
    "stop": stop_strings,
    "stop_token_ids": count("max_token_ids"),
    "structured_outputs": schema,
    "text": schema,
    **_free(NUMBER, "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "ignore_eos"),
    **_free(NUMBER, "parallel_tool_calls", "stream", "reasoning"),
    "include": "matched against one value (message.output_text.logprobs)",
    "metadata": "echoed in the response once; bounded by the request body",
    "previous_response_id": "refused by the translation: the gateway keeps no responses",
    "conversation": "refused by the translation: the gateway keeps no responses",
    "background": "refused by the translation: the gateway keeps no responses",
    **_free(NOT_TRANSLATED, "access_programs", "background_options", "context_management", "image"),
    **_free(NOT_TRANSLATED, "max_tool_calls", "moderation", "prompt", "prompt_cache_key", "store"),
    **_free(NOT_TRANSLATED, "prompt_cache_options", "prompt_cache_retention", "safety_identifier"),
    **_free(NOT_TRANSLATED, "service_tier", "stream_options", "truncation", "user"),
}

FIELDS: dict[str, Fields] = {
    "chat_completions": CHAT_COMPLETIONS,
    "completions": COMPLETIONS,
    "messages": MESSAGES,
    "responses": RESPONSES,
}


def check_request(api: str, body: dict[str, Any], limits: RequestLimits) -> None:
    """Refuse (RequestRefused, naming the field and its limit) a body of `api` that asks for more than
    `limits` allow or names a media URL the gateway may not pass on; reads only the classified fields."""
    check_fields(FIELDS[api], body, limits)
