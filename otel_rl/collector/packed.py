"""Packed token attributes (otel_rl.prompt_token_ids, otel_rl.choices.{i}.*) to call_tokens list arrays."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pyarrow as pa

from otel_rl.attributes import PROMPT_TOKEN_IDS
from otel_rl.collector.limits import choice_index, is_index
from otel_rl.store.arrow_rows import per_batch_arrays
from otel_rl.store.layout import CALL_TOKENS, Sender


class PackedTokens:
    """Packed token attributes of one span, still as raw little-endian bytes."""

    __slots__ = ("trace_id", "span_id", "prompt", "choice_ids", "choice_logprobs")

    def __init__(self, trace_id: str, span_id: str) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.prompt: bytes | None = None
        self.choice_ids: dict[int, bytes] = {}
        self.choice_logprobs: dict[int, bytes] = {}


def take_packed(tokens: PackedTokens, key: str, data: bytes) -> bool:
    """Record a packed token attribute; False when `key` is not one (it then stays an ordinary attribute)."""
    parts = key.split(".")  # otel_rl.prompt_token_ids | otel_rl.choices.{i}.token_ids | ...{i}.logprobs
    if key == PROMPT_TOKEN_IDS:
        target = None
    elif len(parts) == 4 and parts[1] == "choices" and is_index(parts[2]) and parts[3] == "token_ids":
        target = tokens.choice_ids
    elif len(parts) == 4 and parts[1] == "choices" and is_index(parts[2]) and parts[3] == "logprobs":
        target = tokens.choice_logprobs
    else:
        return False
    if len(data) % 4:
        raise ValueError(
            f"attribute {key!r} has {len(data)} bytes, not a whole number of 4-byte little-endian values"
        )
    if target is None:
        tokens.prompt = data
    else:
        # call_tokens holds one list per choice up to the highest index: bounded before it is allocated
        target[choice_index(key, parts[2])] = data
    return True


def _list_array(chunks: list[bytes | None], dtype: str, value_type: pa.DataType) -> pa.Array:
    """One list per chunk of packed little-endian values (None -> null list), without per-value objects."""
    lengths = np.fromiter((len(c) if c is not None else 0 for c in chunks), dtype=np.int64, count=len(chunks))
    offsets = np.zeros(len(chunks) + 1, dtype=np.int32)
    np.cumsum(lengths // 4, out=offsets[1:])
    values = np.frombuffer(b"".join(c for c in chunks if c is not None), dtype=dtype)
    mask = pa.array(np.fromiter((c is None for c in chunks), dtype=bool, count=len(chunks)))
    return pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(values, type=value_type), mask=mask if mask.true_count else None
    )


def _nested_list_array(
    per_span: list[dict[int, bytes]], n_choices: list[int], dtype: str, value_type: pa.DataType
) -> pa.Array:
    """One list of per-choice lists per span, choices in index order; an unrecorded choice is a null list."""
    flat = [choices.get(i) for choices, n in zip(per_span, n_choices, strict=True) for i in range(n)]
    inner = _list_array(flat, dtype, value_type)
    offsets = np.zeros(len(per_span) + 1, dtype=np.int32)
    np.cumsum(n_choices, out=offsets[1:])
    mask = pa.array([not choices for choices in per_span], type=pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets), inner, mask=mask if mask.true_count else None)


def call_tokens_table(packed: list[PackedTokens], received_at: datetime, sender: Sender) -> pa.Table:
    """call_tokens rows for the spans that carried packed token attributes (received with them, from the
    same sender)."""
    n_choices = [max([*t.choice_ids, *t.choice_logprobs], default=-1) + 1 for t in packed]
    arrays = [
        pa.array([t.trace_id for t in packed], type=pa.string()),
        pa.array([t.span_id for t in packed], type=pa.string()),
        _list_array([t.prompt for t in packed], "<i4", pa.int32()),
        _nested_list_array([t.choice_ids for t in packed], n_choices, "<i4", pa.int32()),
        _nested_list_array([t.choice_logprobs for t in packed], n_choices, "<f4", pa.float32()),
        *per_batch_arrays(received_at, sender, len(packed)),
    ]
    return pa.Table.from_arrays(arrays, schema=CALL_TOKENS.schema)
