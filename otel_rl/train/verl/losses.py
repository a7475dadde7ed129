"""verl's PPO loss for a single-epoch update, without the extra forward pass for the "old" log-probs.

With one PPO epoch the parameters change only after the whole batch's backward, so the policy before the
update is the one being differentiated: its log-probs are this forward's, detached (what the local backend
does). verl's trainer instead runs `compute_log_prob` first, a full forward more per step. This loss, set
on verl's worker with its own `set_loss_fn`, fills `old_log_probs` and the importance weights against vLLM's
logprobs from the forward it is given, then calls verl's `ppo_loss` unchanged.
"""

from typing import Any

import torch
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
from verl.utils.metric import AggregationType, Metric
from verl.workers.config import ActorConfig
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import no_padding_2_padding


def single_epoch_ppo_loss(
    config: ActorConfig,
    model_output: dict[str, Any],
    data: Any,
    dp_group: Any = None,
    *,
    rollout_is: str | None,
    rollout_is_threshold: float,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's ppo_loss with old log-probs = this forward's, and truncated IS weights pi_old / pi_served
    times the per-token loss weights (`token_weights`) as its `rollout_is_weights`."""
    old = no_padding_2_padding(model_output["log_probs"], data).detach().float()
    weights = data["token_weights"]
    mask = data["response_mask"].float()
    data["old_log_probs"] = old
    metrics: dict[str, Any] = {}
    if "rollout_log_probs" in data.keys():  # noqa: SIM118 (a TensorDict)
        log_ratio = old - data["rollout_log_probs"]
        # Sums over this micro-batch divided by the whole batch's tokens (all ranks'), times the ranks: verl
        # adds a rank's micro-batches (SUM) and averages the ranks, which gives the batch's token means.
        per_batch = data["batch_num_tokens"] / data["dp_size"]
        metrics["mismatch"] = Metric(AggregationType.SUM, ((log_ratio.abs() * mask).sum() / per_batch).item())
        if rollout_is is not None:
            is_weights, _ = compute_rollout_correction_weights(
                log_ratio=log_ratio,
                response_mask=mask,
                rollout_is=rollout_is,
                rollout_is_threshold=rollout_is_threshold,
            )
            weights = weights * is_weights
            metrics["is_weight_mean"] = Metric(
                AggregationType.SUM, ((is_weights * mask).sum() / per_batch).item()
            )
    data["rollout_is_weights"] = weights
    loss, verl_metrics = ppo_loss(config, model_output, data, dp_group)
    return loss, verl_metrics | metrics
