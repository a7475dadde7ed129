"""Token ids per model call: the exact ids the server recorded, else the messages retokenized."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

EXACT = "exact"
RETOKENIZED = "retokenized"
# llm_calls.logprobs_source of logprobs sampled under constraints: not the policy's (docs/gateway.md)
CONSTRAINED_LOGPROBS = "constrained"


def openai_message(message: dict[str, Any]) -> dict[str, Any]:
    """A normalized message in the OpenAI chat shape (tool-call arguments stay JSON text)."""
    out: dict[str, Any] = {"role": message["role"], "content": message.get("content")}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": call.get("id"),
                "type": "function",
                "function": {"name": call["name"], "arguments": call["arguments"]},
            }
            for call in message["tool_calls"]
        ]
    if message.get("tool_call_id"):
        out["tool_call_id"] = message["tool_call_id"]
    return out


def _arguments_object(arguments: Any) -> Any:
    """HF chat templates expect tool-call arguments as an object; keep the text when it is not JSON."""
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def template_message(message: dict[str, Any]) -> dict[str, Any]:
    """A normalized message as transformers chat templates expect it (arguments parsed, reasoning named)."""
    out = openai_message(message)
    out["content"] = out["content"] or ""
    for call in out.get("tool_calls", ()):
        call["function"]["arguments"] = _arguments_object(call["function"]["arguments"])
    if message.get("reasoning"):
        out["reasoning_content"] = message["reasoning"]
    return out


def _json_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return json.loads(value) if isinstance(value, str) else list(value)


def render_call(
    tokenizer: Any, input_messages: Any, output_messages: Any, tools: Any
) -> tuple[str, list[str]]:
    """The prompt text the template gives the call's input, and each choice's completion text.

    A completion is what the template's rendering of input + that answer adds after the prompt, cut just
    after the end-of-sequence token: what follows it (a newline, say) is glue that the model did not sample
    and that the next call's prompt carries. Raises ValueError when the template is not append-only here.
    """
    messages = [template_message(m) for m in _json_list(input_messages)]
    tool_list = _json_list(tools) or None
    prompt = tokenizer.apply_chat_template(
        messages, tools=tool_list, add_generation_prompt=True, tokenize=False
    )
    eos = tokenizer.eos_token
    completions = []
    for answer in _json_list(output_messages):
        full = tokenizer.apply_chat_template(
            [*messages, template_message(answer)], tools=tool_list, tokenize=False
        )
        if not full.startswith(prompt):
            raise ValueError("the chat template rewrites earlier turns when an answer is appended")
        completion = full[len(prompt) :]
        end = completion.rfind(eos) if eos else -1
        completions.append(completion[: end + len(eos)] if end >= 0 else completion)
    return prompt, completions


@dataclass(frozen=True)
class Retokenized:
    """Retokenized ids: prompt ids per call, completion ids per choice; None for calls that failed."""

    prompt_ids: list[list[int] | None]
    completion_ids: list[list[list[int]] | None]


def retokenize(tokenizer: Any, calls: pl.DataFrame) -> Retokenized:
    """Render every call's messages with the chat template, then encode all texts in one batch."""
    from jinja2 import TemplateError

    texts: list[str] = []
    shapes: list[int | None] = []  # completions per call; None when there is nothing to encode
    for row in calls.select("input_messages", "output_messages", "tool_definitions").iter_rows():
        try:
            prompt, completions = render_call(tokenizer, *row)
        except (ValueError, TemplateError):  # one call the template cannot render must not stop the export
            completions = []
        if not completions:
            shapes.append(None)
            continue
        texts += [prompt, *completions]
        shapes.append(len(completions))
    encoded = iter(tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else ())
    prompt_ids: list[list[int] | None] = []
    completion_ids: list[list[list[int]] | None] = []
    for n in shapes:
        prompt_ids.append(None if n is None else next(encoded))
        completion_ids.append(None if n is None else [next(encoded) for _ in range(n)])
    return Retokenized(prompt_ids, completion_ids)


def _has_messages() -> pl.Expr:
    return pl.col("input_messages").is_not_null() & pl.col("output_messages").is_not_null()


def call_tokens(calls: pl.DataFrame, tokenizer: Any | None) -> pl.DataFrame:
    """Add `prompt_ids`, `completion_ids` (one list per choice), `completion_logprobs` and `token_source`.

    Exact ids are used when the call recorded both prompt and completion ids; otherwise, with a tokenizer, the
    normalized messages are retokenized (`token_source = retokenized`, `completion_logprobs` null: unknown).
    Logprobs of a constrained distribution (`logprobs_source = constrained`) are not the policy's: null too.
    Calls left without ids (no tokenizer, no messages, or a template that is not append-only) get a null
    `token_source`.
    """
    exact = pl.col("prompt_token_ids").is_not_null() & pl.col("completion_token_ids").is_not_null()
    calls = calls.with_columns(_exact=exact, _row=pl.int_range(pl.len(), dtype=pl.UInt32))
    needed = calls.filter(~pl.col("_exact") & _has_messages()) if tokenizer is not None else calls.clear()
    retok = retokenize(tokenizer, needed) if needed.height else Retokenized([], [])
    retok_frame = pl.DataFrame(
        {
            "_row": needed["_row"],
            "_rprompt": pl.Series(retok.prompt_ids, dtype=pl.List(pl.Int32)),
            "_rcompletion": pl.Series(retok.completion_ids, dtype=pl.List(pl.List(pl.Int32))),
        }
    )
    exact_or = pl.when("_exact").then
    policys_logprobs = pl.col("logprobs_source").ne_missing(CONSTRAINED_LOGPROBS)
    return (
        calls.join(retok_frame, on="_row", how="left")
        .sort("_row")
        .with_columns(
            prompt_ids=exact_or(pl.col("prompt_token_ids").cast(pl.List(pl.Int32))).otherwise("_rprompt"),
            completion_ids=exact_or(
                pl.col("completion_token_ids").cast(pl.List(pl.List(pl.Int32)))
            ).otherwise("_rcompletion"),
            completion_logprobs=pl.when(pl.col("_exact") & policys_logprobs).then(
                pl.col("completion_logprobs").cast(pl.List(pl.List(pl.Float32)))
            ),
            token_source=exact_or(pl.lit(EXACT))
            .when(pl.col("_rprompt").is_not_null())
            .then(pl.lit(RETOKENIZED)),
        )
        .drop("_exact", "_row", "_rprompt", "_rcompletion")
    )


@dataclass(frozen=True)
class Drift:
    """How often retokenizing the messages misses the exact ids the server saw."""

    compared: int
    differing: int
    first_diff_positions: list[int]  # per differing call: first position where prompt + completion ids differ

    @property
    def share(self) -> float:
        return self.differing / self.compared if self.compared else 0.0


def first_difference(a: np.ndarray, b: np.ndarray) -> int:
    """Index of the first differing token of two id arrays (-1 when equal)."""
    n = min(len(a), len(b))
    unequal = np.flatnonzero(a[:n] != b[:n])
    if unequal.size:
        return int(unequal[0])
    return -1 if len(a) == len(b) else n


def measure_drift(calls: pl.DataFrame, tokenizer: Any, limit: int) -> Drift:
    """Retokenize up to `limit` calls with exact ids and messages; compare prompt + first completion."""
    sample = calls.filter(
        pl.col("prompt_token_ids").is_not_null()
        & pl.col("completion_token_ids").is_not_null()
        & _has_messages()
    ).head(limit)
    retok = retokenize(tokenizer, sample)
    positions = []
    compared = 0
    for row, prompt, completions in zip(
        sample.select("prompt_token_ids", "completion_token_ids").iter_rows(),
        retok.prompt_ids,
        retok.completion_ids,
        strict=True,
    ):
        compared += 1
        exact = np.array([*row[0], *row[1][0]], dtype=np.int64)
        again = np.array([*(prompt or []), *(completions[0] if completions else [])], dtype=np.int64)
        position = first_difference(exact, again)
        if position >= 0:
            positions.append(position)
    return Drift(compared=compared, differing=len(positions), first_diff_positions=positions)
