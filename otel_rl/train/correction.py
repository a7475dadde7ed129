"""The served-policy correction both backends apply: how far the trainer's logprobs are from vLLM's, and the
truncated importance weight pi_old / pi_served that corrects stale samples and train/serve drift."""

import logging
from collections.abc import Sequence

import numpy as np
import torch
import verl.utils.torch_functional as verl_F
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

from otel_rl.train.config import AlgorithmSettings

log = logging.getLogger(__name__)
NAMED_CALLS = 3  # calls a mismatch warning names


def served_policy_correction(
    old: torch.Tensor,
    served: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor,
    algo: AlgorithmSettings,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`weights` times the IS weight (when `algorithm.rollout_is` is set), and the mismatch metrics."""
    metrics = {"mismatch": verl_F.masked_mean((old - served).abs(), mask).item()}
    if algo.rollout_is is not None:
        is_weights, _ = compute_rollout_correction_weights(
            log_ratio=old - served,
            response_mask=mask,
            rollout_is=algo.rollout_is,
            rollout_is_threshold=algo.rollout_is_threshold,
        )
        weights = weights * is_weights
        metrics["is_weight_mean"] = verl_F.masked_mean(is_weights, mask).item()
    return weights, metrics


def warn_on_mismatch(
    old: torch.Tensor,
    served: torch.Tensor,
    mask: torch.Tensor,
    non_tensors: dict[str, np.ndarray],
    threshold: float,
) -> list[tuple[str, str, float]]:
    """Log a warning naming the calls with the largest mismatch when the batch's mismatch is above `threshold`
    (`algorithm.mismatch_warning`); returns them, as (rollout id, span id, mean |Δ|), empty when below."""
    delta = (old - served).abs().float() * mask
    mismatch = (delta.sum() / mask.sum().clamp(min=1)).item()
    if mismatch <= threshold:
        return []
    rows = len(delta)  # a batch built without to_dataproto's names: its rows are named by position
    rollout_ids = non_tensors.get("rollout_id", [f"(row {row})" for row in range(rows)])
    worst = worst_calls(
        delta.cpu().numpy(), mask.cpu().numpy() > 0, rollout_ids, non_tensors.get("span_ids", ["?"] * rows)
    )
    worst = [call for call in worst if call[2] > threshold] or worst  # the culprits, when some stand out
    named = ", ".join(f"rollout {r} span {s} ({m:.3g})" for r, s, m in worst)
    log.warning(
        "train/serve mismatch %.3g is above algorithm.mismatch_warning %g: the recorded logprobs are not the "
        "policy's (stale samples, other weights or dtype served, constrained decoding without "
        "llm_calls.logprobs_source = 'rescored'); largest mean |Δ| per call: %s",
        mismatch,
        threshold,
        named,
    )
    return worst


def worst_calls(
    delta: np.ndarray, sampled: np.ndarray, rollout_ids: Sequence[str], span_ids: Sequence[str]
) -> list[tuple[str, str, float]]:
    """The NAMED_CALLS calls with the largest mean |Δ| over their sampled tokens, largest first. A sample's
    runs of sampled tokens are its calls' answers in `span_ids` order (comma-separated, as to_dataproto
    writes them); when the runs do not pair up with them (answers cut by the limits), the sample's calls are
    named together."""
    found = []
    for row in range(len(delta)):
        mask = sampled[row]
        starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
        ends = np.flatnonzero(mask & ~np.concatenate([mask[1:], [False]])) + 1
        spans = str(span_ids[row]).split(",")
        if len(starts) != len(spans):
            starts, ends, spans = starts[:1], ends[-1:], [",".join(spans)]
        for start, end, span in zip(starts, ends, spans, strict=True):
            found.append((str(rollout_ids[row]), span, float(delta[row, start:end].mean())))
    return sorted(found, key=lambda call: -call[2])[:NAMED_CALLS]
