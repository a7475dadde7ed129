"""The served-policy correction both backends apply: how far the trainer's logprobs are from vLLM's, and the
truncated importance weight pi_old / pi_served that corrects stale samples and train/serve drift."""

import torch
import verl.utils.torch_functional as verl_F
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

from otel_rl.train.config import AlgorithmSettings


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
