"""Merge a rollout's model calls into trajectory segments by exact token-prefix matching."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

ABORTED_FINISH_REASONS = ("abort", "error")
# llm_calls.logprobs_source of calls vLLM sampled under constraints (rescored: logprobs the policy's again)
CONSTRAINED_SOURCES = ("rescored", "constrained")


def flat_lists(series: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """Values and offsets (n + 1, from 0) of a polars list column, through Arrow without copying tokens.

    A null list has no values (its two offsets are equal).
    """
    array = series.rechunk().to_arrow()
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    offsets = array.offsets.to_numpy()
    values = array.values.slice(offsets[0], offsets[-1] - offsets[0]).to_numpy(zero_copy_only=False)
    return values, (offsets - offsets[0]).astype(np.int64)


def list_series(name: str, values: np.ndarray, offsets: np.ndarray) -> pl.Series:
    """A polars list column built from flat values and offsets (no per-token Python objects)."""
    array = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(values))
    return pl.Series(name, array)


@dataclass(frozen=True)
class Break:
    """Where a call's prompt first differs from its predecessor's context (that call's prompt + answer):
    `position` in the prompt, the context's token there and the prompt's (None past either one's end)."""

    call: int  # the row of `calls`; merge_segments turns it into a span id
    position: int
    expected: int | None
    found: int | None


@dataclass(frozen=True)
class MergeCounts:
    """Calls and choices the merge left out, by reason; calls that started a segment of their own although
    the rollout had one open (their prompt extends no earlier call's context), and the first of them."""

    duplicate_calls: int
    aborted_choices: int
    unmerged_calls: int = 0
    first_break: Break | None = None


def _starts_with(
    tokens: pa.Buffer, start: int, end: int, prefix: pa.Buffer, p_start: int, p_end: int
) -> bool:
    """Whether bytes start:end of `tokens` begin with bytes p_start:p_end of `prefix` (zero-copy, memcmp)."""
    n = p_end - p_start
    return n <= end - start and tokens.slice(start, n).equals(prefix.slice(p_start, n))


def _assign_segments(
    rollout_starts: list[int],
    prompt_offsets: list[int],
    choice_offsets: list[int],
    completion_offsets: list[int],
    aborted: list[bool],
    prompts: pa.Buffer,
    completions: pa.Buffer,
) -> tuple[list[list[int]], MergeCounts]:
    """The sequential heart: per rollout, in call order, put every usable choice into a segment.

    Returns the segments as lists of choice indices. Offsets are in bytes (int32 tokens), so each prefix test
    is one comparison of two zero-copy buffer slices: no per-token Python work.
    """
    call_of = np.repeat(np.arange(len(choice_offsets) - 1), np.diff(choice_offsets)).tolist()

    def prompt_starts_with(call: int, other: int) -> bool:
        return _starts_with(
            prompts,
            prompt_offsets[call],
            prompt_offsets[call + 1],
            prompts,
            prompt_offsets[other],
            prompt_offsets[other + 1],
        )

    def same_answers(choices: list[int], others: list[int]) -> bool:
        return all(
            _starts_with(
                completions,
                completion_offsets[c],
                completion_offsets[c + 1],
                completions,
                completion_offsets[o],
                completion_offsets[o + 1],
            )
            for c, o in zip(choices, others, strict=True)
        )

    segments: list[list[int]] = []
    duplicates = aborted_count = unmerged = 0
    first_break: Break | None = None
    for r0, r1 in zip(rollout_starts[:-1], rollout_starts[1:], strict=True):
        open_segments: list[int] = []
        previous = -1  # the last choice kept in this rollout: the predecessor a break is measured against
        merged: dict[tuple[int, ...], list[list[int]]] = {}  # sizes of prompt and answers -> choices of calls
        for call in range(r0, r1):
            choices = [c for c in range(choice_offsets[call], choice_offsets[call + 1]) if not aborted[c]]
            aborted_count += choice_offsets[call + 1] - choice_offsets[call] - len(choices)
            if not choices:
                continue
            prompt_length = prompt_offsets[call + 1] - prompt_offsets[call]
            sizes = (prompt_length, *(completion_offsets[c + 1] - completion_offsets[c] for c in choices))
            same_sizes = merged.setdefault(sizes, [])
            if any(prompt_starts_with(call, call_of[o[0]]) and same_answers(choices, o) for o in same_sizes):
                duplicates += 1  # a retried identical call: kept once
                continue
            same_sizes.append(choices)
            # extend the open segment with the longest context (its last call's prompt + answer) that prefixes
            # this prompt; any open segment qualifies, so interleaved agents each keep their own segment
            best, best_length = -1, -1
            for s in open_segments:
                last = segments[s][-1]
                last_prompt = prompt_offsets[call_of[last] + 1] - prompt_offsets[call_of[last]]
                length = last_prompt + completion_offsets[last + 1] - completion_offsets[last]
                if (
                    best_length < length <= prompt_length
                    and prompt_starts_with(call, call_of[last])
                    and _starts_with(
                        prompts,
                        prompt_offsets[call] + last_prompt,
                        prompt_offsets[call + 1],
                        completions,
                        completion_offsets[last],
                        completion_offsets[last + 1],
                    )
                ):
                    best, best_length = s, length
            if best < 0 and previous >= 0:
                unmerged += 1
                if first_break is None:
                    first_break = _break(
                        call,
                        call_of[previous],
                        previous,
                        prompts,
                        completions,
                        (prompt_offsets, completion_offsets),
                    )
            for k, choice in enumerate(choices):
                if k == 0 and best >= 0:
                    segments[best].append(choice)
                else:  # extends nothing, or a sibling choice of an n > 1 call
                    open_segments.append(len(segments))
                    segments.append([choice])
            previous = choices[0]
    counts = MergeCounts(duplicates, aborted_count, unmerged_calls=unmerged, first_break=first_break)
    return segments, counts


def _break(
    call: int,
    before: int,
    choice: int,
    prompts: pa.Buffer,
    completions: pa.Buffer,
    offsets: tuple[list[int], list[int]],
) -> Break:
    """Where `call`'s prompt leaves the context of the call `before` it (its prompt + answer `choice`)."""
    prompt_offsets, completion_offsets = offsets

    def tokens(buffer: pa.Buffer, offsets: list[int], row: int) -> np.ndarray:
        return np.frombuffer(buffer, dtype=np.int32)[offsets[row] // 4 : offsets[row + 1] // 4]

    context = np.concatenate(
        [tokens(prompts, prompt_offsets, before), tokens(completions, completion_offsets, choice)]
    )
    prompt = tokens(prompts, prompt_offsets, call)
    n = min(len(context), len(prompt))
    differ = np.flatnonzero(context[:n] != prompt[:n])
    position = int(differ[0]) if len(differ) else n

    def at(values: np.ndarray) -> int | None:
        return int(values[position]) if position < len(values) else None

    return Break(call, position, at(context), at(prompt))


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenation of arange(start, start + length) for each pair, vectorized."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    return np.repeat(np.asarray(starts, dtype=np.int64) - (ends - lengths), lengths) + np.arange(
        ends[-1] if len(ends) else 0
    )


def _aligned_logprobs() -> pl.Expr:
    """Recorded logprobs when they cover every choice token for token, else null (unknown)."""
    recorded = pl.col("completion_logprobs")
    lengths = pl.col("completion_ids").list.eval(pl.element().list.len())
    aligned = recorded.list.eval(pl.element().list.len()) == lengths
    return pl.when(aligned).then(recorded.cast(pl.List(pl.List(pl.Float32))))


def merge_segments(calls: pl.DataFrame) -> tuple[pl.DataFrame, MergeCounts]:
    """Merge calls (grouped by `rollout_id`, each rollout's calls in time order) into segments.

    Needs `rollout_id`, `span_id`, `prompt_ids`, `completion_ids`, `completion_logprobs`, `logprobs_source`,
    `finish_reasons`, `policy_version`, `token_source`. A call extends the open segment whose whole context
    (its last call's prompt + answer) is an exact token prefix of the call's prompt; the tokens in between
    join with mask 0.
    A call that extends none starts a segment; an identical repeat of a call is kept once; aborted choices
    are left out; the first kept choice of an n > 1 call extends, each other choice starts a sibling one.
    """
    calls = calls.with_columns(
        _aligned_logprobs().alias("completion_logprobs"),
        pl.col("finish_reasons").list.eval(pl.element().is_in(ABORTED_FINISH_REASONS)).alias("_aborted"),
    )
    run = calls["rollout_id"].rle_id().to_numpy()
    if calls.height and run[-1] + 1 != calls["rollout_id"].n_unique():
        raise ValueError("calls must be grouped by rollout_id (sort by rollout_id, then start time)")
    rollout_starts = [*np.flatnonzero(np.diff(run, prepend=-1)).tolist(), calls.height]

    prompt_values, prompt_offsets = flat_lists(calls["prompt_ids"])
    choices, choice_offsets = flat_lists_of_lists(calls["completion_ids"])
    completion_values, completion_offsets = choices
    choice_counts = np.diff(choice_offsets)
    aborted = _choice_flags(calls["_aborted"], choice_counts)
    segments, counts = _assign_segments(
        rollout_starts,
        (prompt_offsets * 4).tolist(),
        choice_offsets.tolist(),
        (completion_offsets * 4).tolist(),
        aborted.tolist(),
        pa.py_buffer(prompt_values.astype(np.int32, copy=False)),
        pa.py_buffer(completion_values.astype(np.int32, copy=False)),
    )

    # per (segment, choice) pair, in segment order
    seg_choice_offsets = np.zeros(len(segments) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in segments], out=seg_choice_offsets[1:])
    choice = np.fromiter((c for s in segments for c in s), dtype=np.int64, count=seg_choice_offsets[-1])
    call_of_choice = np.repeat(np.arange(calls.height), choice_counts)
    call = call_of_choice[choice]
    first, last = seg_choice_offsets[:-1], seg_choice_offsets[1:] - 1
    prompt_lengths = np.diff(prompt_offsets)
    completion_lengths = np.diff(completion_offsets)
    context_start = prompt_lengths[call[first]]  # the segment's prompt is its first call's prompt
    response_lengths = prompt_lengths[call[last]] - context_start + completion_lengths[choice[last]]
    response_offsets = np.zeros(len(segments) + 1, dtype=np.int64)
    np.cumsum(response_lengths, out=response_offsets[1:])

    # response = the last call's prompt past the segment's prompt, then the last answer; sampled spans marked
    response = np.empty(response_offsets[-1], dtype=np.int32)
    tail = prompt_lengths[call[last]] - context_start
    response[ranges(response_offsets[:-1], tail)] = prompt_values[
        ranges(prompt_offsets[call[last]] + context_start, tail)
    ]
    answer_lengths = completion_lengths[choice[last]]
    response[ranges(response_offsets[:-1] + tail, answer_lengths)] = completion_values[
        ranges(completion_offsets[choice[last]], answer_lengths)
    ]
    segment_of_pair = np.repeat(np.arange(len(segments)), np.diff(seg_choice_offsets))
    pair_start = prompt_lengths[call] - context_start[segment_of_pair]
    sampled = ranges(response_offsets[segment_of_pair] + pair_start, completion_lengths[choice])
    mask = np.zeros(response_offsets[-1], dtype=np.int8)
    mask[sampled] = 1
    logprob_values, known = _choice_logprobs(calls["completion_logprobs"], choice_counts, completion_offsets)
    logprobs = np.zeros(response_offsets[-1], dtype=np.float32)
    logprobs[sampled] = logprob_values[ranges(completion_offsets[choice], completion_lengths[choice])]
    has_logprobs = known[choice].astype(np.int8)

    def per_segment(ufunc: np.ufunc, values: np.ndarray) -> np.ndarray:
        return ufunc.reduceat(values, first) if len(segments) else values[:0]

    version = calls["policy_version"].cast(pl.Float64).fill_null(np.nan).to_numpy()[call]
    retokenized = (calls["token_source"] == "retokenized").to_numpy()[call].astype(np.int8)
    constrained = calls["logprobs_source"].is_in(CONSTRAINED_SOURCES).fill_null(False).to_numpy()[call]
    span_ids = calls["span_id"].to_arrow().take(pa.array(call))
    rollout_ids = calls["rollout_id"].gather(call[first])
    segments_frame = pl.DataFrame(
        [
            rollout_ids,
            list_series("prompt_ids", *_gather_lists(prompt_values, prompt_offsets, call[first])),
            list_series("response_ids", response, response_offsets),
            list_series("response_mask", mask, response_offsets),
            list_series("rollout_logprobs", logprobs, response_offsets),
            pl.Series("has_logprobs", per_segment(np.minimum, has_logprobs).astype(bool)),
            pl.Series("policy_version_min", per_segment(np.fmin, version)).fill_nan(None).cast(pl.Int64),
            pl.Series("policy_version_max", per_segment(np.fmax, version)).fill_nan(None).cast(pl.Int64),
            pl.Series("token_source", np.where(per_segment(np.maximum, retokenized), "retokenized", "exact")),
            pl.Series("n_calls", np.diff(seg_choice_offsets).astype(np.int32)),
            pl.Series("constrained_calls", per_segment(np.add, constrained.astype(np.int32))),
            pl.Series("span_ids", pa.LargeListArray.from_arrays(pa.array(seg_choice_offsets), span_ids)),
            list_series(
                "choice_indices", (choice - choice_offsets[call]).astype(np.int32), seg_choice_offsets
            ),
            list_series(
                "turn_ends", (pair_start + completion_lengths[choice]).astype(np.int32), seg_choice_offsets
            ),
        ]
    ).with_columns(
        segment_id=pl.format("{}:{}", "rollout_id", pl.int_range(pl.len()).over("rollout_id")),
    )
    return segments_frame, counts


def flat_lists_of_lists(series: pl.Series) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """(values, inner offsets) and outer offsets of a list-of-lists column; offsets start at 0."""
    outer = series.rechunk().to_arrow()
    if isinstance(outer, pa.ChunkedArray):
        outer = outer.combine_chunks()
    outer_offsets = outer.offsets.to_numpy()
    inner = outer.values.slice(outer_offsets[0], outer_offsets[-1] - outer_offsets[0])
    return flat_lists(pl.Series(inner)), (outer_offsets - outer_offsets[0]).astype(np.int64)


def _choice_flags(flags: pl.Series, choice_counts: np.ndarray) -> np.ndarray:
    """One flag per choice from a list-per-call column that may have fewer entries (missing = False)."""
    values, offsets = flat_lists(flags.cast(pl.List(pl.Boolean)))
    out = np.zeros(int(choice_counts.sum()), dtype=bool)
    starts = np.concatenate([[0], np.cumsum(choice_counts)[:-1]])
    keep = np.minimum(np.diff(offsets), choice_counts)
    out[ranges(starts, keep)] = values.astype(bool)[ranges(offsets[:-1], keep)]
    return out


def _choice_logprobs(
    logprobs: pl.Series, choice_counts: np.ndarray, completion_offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Logprobs laid out like the completion tokens (0 where unknown), and per choice whether they are known.

    `logprobs` is null for a call unless it covers every choice token for token (see `_aligned_logprobs`).
    """
    (values, inner_offsets), call_offsets = flat_lists_of_lists(logprobs)
    # by the null mask, not the offsets: a list nulled by `when/then` keeps its values in Arrow
    known_calls = logprobs.is_not_null().to_numpy() & (np.diff(call_offsets) > 0)
    starts, ends = inner_offsets[call_offsets[:-1]], inner_offsets[call_offsets[1:]]
    known = np.repeat(known_calls, choice_counts)
    out = np.zeros(completion_offsets[-1], dtype=np.float32)
    out[np.repeat(known, np.diff(completion_offsets))] = values[
        ranges(starts[known_calls], (ends - starts)[known_calls])
    ]
    return out, known


def _gather_lists(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lengths = offsets[rows + 1] - offsets[rows]
    out_offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out_offsets[1:])
    return values[ranges(offsets[rows], lengths)], out_offsets
