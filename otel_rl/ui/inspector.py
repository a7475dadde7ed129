"""The token-mask inspector's data: a rollout's training samples as the pipeline builds them, by token."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import polars as pl

from otel_rl.store import ui_reads
from otel_rl.store.reads import Run
from otel_rl.transforms.rewards import ANY_SOURCE, RewardSpec
from otel_rl.transforms.samples import SampleOptions, build_samples, load_inputs
from otel_rl.transforms.tokens import call_tokens

# The inspector builds the samples of the rollout's whole group (GRPO's advantage is relative to the group)
# trusting every reward source: it shows what the pipeline makes of the rollout, not one run's trust policy.
INSPECTOR_OPTIONS = SampleOptions(reward=RewardSpec(trusted_sources=(ANY_SOURCE,)), drift_sample=0)
MAX_SEGMENT_TOKENS = 65_536  # a segment longer than this is shown cut (the page draws every token)


class RolloutNotFound(LookupError):
    """No rollout has this id (HTTP 404)."""


class Tokenizer:
    """The model's tokenizer, loaded on first use from a model folder (None: tokens are shown as ids)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self._loaded: Any = None
        self._lock = threading.Lock()

    def load(self) -> Any:
        """The transformers tokenizer, or None without a model folder."""
        if self.folder is None:
            return None
        with self._lock:
            if self._loaded is None:
                from transformers import AutoTokenizer

                self._loaded = AutoTokenizer.from_pretrained(self.folder)
        return self._loaded

    def pieces(self, ids: list[int]) -> list[str] | None:
        """Each token decoded on its own, or None without a model folder."""
        loaded = self.load()
        return None if loaded is None else loaded.batch_decode([[token] for token in ids])


def rollout_samples(rollout_id: str, run: Run, tokenizer: Tokenizer) -> dict[str, Any]:
    """The rollout's samples (one per merged segment), each token with its mask, logprob and advantage,
    and where each model call's tokens are; or why the pipeline made none."""
    spans, group_id = ui_reads.rollout_group(run, rollout_id)
    if spans == 0:
        raise RolloutNotFound(f"no rollout {rollout_id!r} in the store")
    where, params = (
        ("group_id = $1", [group_id]) if group_id is not None else ("rollout_id = $1", [rollout_id])
    )
    calls, rollouts, rewards = load_inputs(where, run, params=params)
    retokenize = tokenizer.folder is not None and calls["prompt_token_ids"].null_count() > 0
    if retokenize:  # calls recorded without token ids (not through the gateway): tokenized from messages
        calls, rollouts, rewards = load_inputs(where, run, params=params, messages=True)
    samples, report = build_samples(
        calls,
        rollouts,
        rewards,
        tokenizer=tokenizer.load() if retokenize else None,
        options=INSPECTOR_OPTIONS,
    )
    own = samples.filter(pl.col("rollout_id") == rollout_id)
    own_calls = calls.filter(pl.col("rollout_id") == rollout_id)
    # the token ids the samples were built from, for the calls' boundaries
    own_calls = call_tokens(own_calls, tokenizer.load() if retokenize else None)
    segments = [_segment(row, own_calls, tokenizer) for row in own.iter_rows(named=True)]
    return {
        "rollout_id": rollout_id,
        "group_id": group_id,
        "decoded": tokenizer.folder is not None,
        "segments": segments,
        # the group's rollouts the pipeline left out, by reason (this one among them when it has no segment)
        "dropped": report.dropped_rollouts,
        "dropped_calls": report.dropped_calls,
        "trainer_logprobs": None,  # not recorded per token: the training page shows each step's mismatch
    }


def _segment(row: dict[str, Any], calls: pl.DataFrame, tokenizer: Tokenizer) -> dict[str, Any]:
    prompt, response = list(row["prompt_ids"]), list(row["response_ids"])
    ids = (prompt + response)[:MAX_SEGMENT_TOKENS]
    n_prompt = len(prompt)
    mask = ([0] * n_prompt + list(row["response_mask"]))[: len(ids)]
    logprobs = [None] * n_prompt + [
        lp if (sampled and row["has_logprobs"]) else None
        for lp, sampled in zip(row["rollout_logprobs"], row["response_mask"], strict=True)
    ]
    advantage = row["advantage"]
    return {
        "segment_id": row["segment_id"],
        "reward": row["reward"],
        "advantage": advantage,
        "loss_weight": row["loss_weight"],
        "policy_version_min": row["policy_version_min"],
        "policy_version_max": row["policy_version_max"],
        "token_source": row["token_source"],
        "truncated": row["truncated"],
        "prompt_tokens": n_prompt,
        "tokens": len(prompt) + len(response),
        "shown_tokens": len(ids),
        "ids": ids,
        "text": tokenizer.pieces(ids),
        "mask": mask,
        "logprob": logprobs[: len(ids)],
        # the same advantage on every trained token (outcome reward, GRPO); inserted tokens get none
        "advantage_per_token": [advantage if m else None for m in mask],
        "calls": _call_boundaries(row, calls, len(ids)),
    }


def _call_boundaries(row: dict[str, Any], calls: pl.DataFrame, length: int) -> list[dict[str, Any]]:
    """Where each merged call's answer lies in the segment's tokens: call k's prompt is the segment so far
    (the merge's rule), so its answer starts at its prompt's length; tokens between two answers were inserted
    (tool results, the next user turn)."""
    by_span = {
        span: (prompt, completions)
        for span, prompt, completions in calls.select("span_id", "prompt_ids", "completion_ids").iter_rows()
    }
    out = []
    for span_id, choice in zip(row["span_ids"], row["choice_indices"], strict=True):
        prompt, completions = by_span.get(span_id, (None, None))
        if prompt is None or completions is None or choice >= len(completions):
            continue
        start = len(prompt)
        end = start + len(completions[choice] or [])
        out.append(
            {"span_id": span_id, "choice": choice, "start": min(start, length), "end": min(end, length)}
        )
    return out
