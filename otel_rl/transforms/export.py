"""Sample exports: Parquet, a padded verl DataProto, and OpenAI chat fine-tuning JSONL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from otel_rl.transforms.merge import flat_lists
from otel_rl.transforms.tokens import openai_message


def write_parquet(samples: pl.DataFrame, path: str | Path) -> Path:
    """Write the samples (schema in docs/samples.md) to a Parquet file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    samples.write_parquet(path)
    return path


def pad(series: pl.Series, width: int, fill: float, *, left: bool, dtype: Any) -> np.ndarray:
    """A (rows, width) array of a list column, left- or right-aligned, in one vectorized copy."""
    values, offsets = flat_lists(series)
    lengths = np.diff(offsets)
    if len(lengths) and lengths.max() > width:
        raise ValueError(f"{series.name}: a row has {lengths.max()} tokens, more than the width {width}")
    out = np.full((len(lengths), width), fill, dtype=dtype)
    columns = np.arange(width)
    where = columns >= width - lengths[:, None] if left else columns < lengths[:, None]
    out[where] = values
    return out


def to_dataproto(samples: pl.DataFrame, pad_token_id: int) -> Any:
    """Samples -> the padded verl `DataProto` an actor update takes.

    batch: `prompts` (left-padded), `responses` (right-padded), `input_ids` (both), `attention_mask`,
    `position_ids`, `response_mask`, `token_level_scores` (the reward on each row's last response token),
    `advantages` and `returns` (the rollout's advantage on every sampled token), `loss_weights` (per row), and
    `rollout_log_probs` (what the server reported) only when every row has them: without it a trainer must
    recompute old log-probs and skip importance correction. non_tensor_batch: `uid` (the group id, or the
    rollout id for a rollout without group), `rollout_id`, `segment_id`, `span_ids` (the segment's calls,
    comma-separated).
    """
    import torch
    from verl import DataProto

    if samples.height == 0:
        raise ValueError("no samples to batch")
    prompt_width = int(samples["prompt_ids"].list.len().max())
    response_width = int(samples["response_ids"].list.len().max())
    prompts = torch.from_numpy(
        pad(samples["prompt_ids"], prompt_width, pad_token_id, left=True, dtype=np.int64)
    )
    responses = torch.from_numpy(
        pad(samples["response_ids"], response_width, pad_token_id, left=False, dtype=np.int64)
    )
    response_mask = torch.from_numpy(
        pad(samples["response_mask"], response_width, 0, left=False, dtype=np.int64)
    )
    response_lengths = torch.from_numpy(samples["response_ids"].list.len().to_numpy().astype(np.int64))
    prompt_lengths = torch.from_numpy(samples["prompt_ids"].list.len().to_numpy().astype(np.int64))
    columns = torch.arange(max(prompt_width, response_width))
    attention_mask = torch.cat(
        [
            (columns[:prompt_width] >= prompt_width - prompt_lengths[:, None]).long(),
            (columns[:response_width] < response_lengths[:, None]).long(),
        ],
        dim=1,
    )
    rows = torch.arange(samples.height)
    scores = torch.zeros(samples.height, response_width)
    scores[rows, response_lengths - 1] = torch.from_numpy(samples["reward"].to_numpy().astype(np.float32))
    advantage = torch.from_numpy(samples["advantage"].to_numpy().astype(np.float32))
    advantages = advantage[:, None] * response_mask
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0),
        "response_mask": response_mask,
        "token_level_scores": scores,
        "advantages": advantages,
        "returns": advantages.clone(),
        "loss_weights": torch.from_numpy(samples["loss_weight"].to_numpy().astype(np.float32)),
    }
    if samples["has_logprobs"].all():
        tensors["rollout_log_probs"] = torch.from_numpy(
            pad(samples["rollout_logprobs"], response_width, 0.0, left=False, dtype=np.float32)
        )
    uid = samples.select(pl.coalesce("group_id", "rollout_id")).to_series()
    names = {"rollout_id": samples["rollout_id"], "segment_id": samples["segment_id"]}
    if "span_ids" in samples.columns:  # samples made by hand may lack it
        names["span_ids"] = samples["span_ids"].list.join(",")
    return DataProto.from_dict(
        tensors=tensors,
        non_tensors={
            "uid": uid.to_numpy().astype(object),
            **{name: column.to_numpy().astype(object) for name, column in names.items()},
        },
        meta_info={"pad_token_id": pad_token_id},
    )


def sft_records(samples: pl.DataFrame, calls: pl.DataFrame, min_reward: float | None) -> list[dict[str, Any]]:
    """OpenAI chat fine-tuning records: one per segment whose rollout's reward is at least `min_reward`.

    A segment's record is its last call's input messages followed by the answer that call gave in this segment
    (the chosen choice), with the call's tool definitions: the whole conversation of that segment, since
    the last call's context holds every earlier turn.
    """
    kept = samples if min_reward is None else samples.filter(pl.col("reward") >= min_reward)
    last = kept.select(
        span_id=pl.col("span_ids").list.last(), choice=pl.col("choice_indices").list.last()
    ).join(
        calls.select("span_id", "input_messages", "output_messages", "tool_definitions"),
        on="span_id",
        how="left",
    )
    records = []
    for span_id, choice, inputs, outputs, tools in last.iter_rows():
        if inputs is None or outputs is None:
            raise ValueError(f"call {span_id} has no recorded messages: cannot export it as a chat")
        answers = json.loads(outputs)
        messages = [openai_message(m) for m in [*json.loads(inputs), answers[choice]]]
        record: dict[str, Any] = {"messages": messages}
        if tools and json.loads(tools):
            record["tools"] = json.loads(tools)
        records.append(record)
    return records


def write_jsonl(records: list[dict[str, Any]], path: str | Path) -> Path:
    """One JSON object per line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        out.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    return path
