"""The local trainer: a transformers policy updated with verl's policy losses, on CPU or one GPU."""

import copy
import math
import os
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
import verl.utils.torch_functional as verl_F
from transformers import AutoModelForCausalLM, AutoTokenizer
from verl import DataProto
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty
from verl.utils.model import compute_position_id_with_mask
from verl.workers.config.actor import ActorConfig

from otel_rl.train.config import TrainConfig
from otel_rl.train.correction import served_policy_correction, warn_on_mismatch

# What every RL batch must carry (verl's names, as otel_rl.transforms.to_dataproto builds them).
# Optional: position_ids, rollout_log_probs (the logprobs vLLM recorded), loss_weights (one per sample).
RL_BATCH_KEYS = ("input_ids", "attention_mask", "responses", "response_mask", "advantages")


TRAINER_STATE_FILE = "trainer_state.pt"  # optimizer moments + schedule: needed to resume, not to serve


class Trainer:
    """Holds the policy and its optimizer; `step` is one RL update, `sft_step` one supervised update."""

    def __init__(self, config: TrainConfig):
        self.config = config
        torch.set_num_threads(config.torch_threads)
        torch.manual_seed(config.seed)
        self.device = torch.device(config.device)
        self.tokenizer = AutoTokenizer.from_pretrained(config.model)
        # float32: with vLLM serving float32 too, trainer and server logprobs agree to ~1e-6.
        self.model = AutoModelForCausalLM.from_pretrained(config.model, dtype=torch.float32).to(self.device)
        self.model.train()
        # The reference policy of the KL penalty is the starting one, frozen.
        self.reference = None
        if config.algorithm.kl_coef > 0:
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)

        optim = config.optim
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.steps_done = 0

        algo = config.algorithm
        self.policy_loss = get_policy_loss_fn(algo.policy_loss)
        # verl's loss functions read their hyper-parameters from an ActorConfig; these are the ones used.
        self.actor_config = ActorConfig(
            strategy="local",
            rollout_n=algo.group_size,
            ppo_micro_batch_size_per_gpu=optim.micro_batch_size,
            clip_ratio=algo.clip_ratio_low,
            clip_ratio_low=algo.clip_ratio_low,
            clip_ratio_high=algo.clip_ratio_high,
            clip_ratio_c=algo.clip_ratio_c,
            loss_agg_mode=algo.loss_agg_mode,
            ppo_epochs=algo.ppo_epochs,
            use_torch_compile=False,
        )

    def _lr_factor(self, step: int) -> float:
        optim = self.config.optim
        if step < optim.warmup_steps:
            return (step + 1) / optim.warmup_steps
        if optim.schedule == "constant":
            return 1.0
        progress = (step - optim.warmup_steps) / max(1, self.config.steps - optim.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    def response_logprobs(self, model: torch.nn.Module, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        """Log-probabilities of the response tokens under `model`: one forward over prompt+response."""
        logits = model(
            input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=mb["position_ids"]
        ).logits
        # The logit at position t predicts token t+1: the response is predicted from the last prompt token on.
        response_logits = logits[:, -mb["responses"].shape[1] - 1 : -1]
        return verl_F.logprobs_from_logits(response_logits, mb["responses"])

    def step(self, batch: DataProto) -> dict[str, float]:
        """One policy update on a batch of samples (prompts left-padded, responses right-padded)."""
        algo = self.config.algorithm
        tensors = self._rl_tensors(batch)
        response_mask = tensors["response_mask"]
        n_tokens = response_mask.sum().clamp(min=1).item()
        # Normalize by the whole batch, not per micro-batch: accumulated micro-batch losses then add up to the
        # full batch's loss (verl's global_batch_info, which does the same across data-parallel ranks).
        self.actor_config.global_batch_info.update(
            dp_size=1,
            batch_num_tokens=n_tokens,
            global_batch_size=(response_mask.sum(-1) > 0).sum().clamp(min=1).item(),
        )

        old_logprobs: list[torch.Tensor] = []
        totals: dict[str, float] = defaultdict(float)
        for epoch in range(algo.ppo_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for i, rows in enumerate(_row_slices(len(batch), self.config.optim.micro_batch_size)):
                mb = {key: value[rows] for key, value in tensors.items()}
                logprobs = self.response_logprobs(self.model, mb)
                if epoch == 0:
                    # Parameters change only at the end of an epoch: these are the logprobs before the update,
                    # the PPO "old" policy, and what the train/serve mismatch is measured on.
                    old_logprobs.append(logprobs.detach())
                loss, mb_metrics = self._rl_loss(mb, logprobs, old_logprobs[i])
                loss.backward()
                share = mb["response_mask"].sum().item() / n_tokens / algo.ppo_epochs
                for name, value in mb_metrics.items():
                    # losses are already normalized by the whole batch; token means are weighted by tokens
                    totals[name] += value / algo.ppo_epochs if name.endswith("loss") else value * share
            grad_norm = self._optimizer_step()
        if "rollout_log_probs" in tensors:
            served = tensors["rollout_log_probs"]
            warn_on_mismatch(
                torch.cat(old_logprobs), served, response_mask, batch.non_tensor_batch, algo.mismatch_warning
            )

        return {
            **totals,
            "loss": totals["pg_loss"] + algo.kl_coef * totals.get("kl_loss", 0.0),
            "grad_norm": grad_norm,
            "lr": self.scheduler.get_last_lr()[0],
            "samples": float(len(batch)),
            "response_tokens": float(n_tokens),
        }

    def _rl_tensors(self, batch: DataProto) -> dict[str, torch.Tensor]:
        missing = [key for key in RL_BATCH_KEYS if key not in batch.batch]
        if missing:
            raise ValueError(f"the batch lacks {missing}; build it with otel_rl.transforms.to_dataproto")
        tensors = {key: batch.batch[key].to(self.device) for key in batch.batch.keys()}  # noqa: SIM118
        tensors["response_mask"] = tensors["response_mask"].float()
        if "position_ids" not in tensors:
            tensors["position_ids"] = compute_position_id_with_mask(tensors["attention_mask"])
        # A rollout split into several segments counts once: each segment's tokens carry its share.
        weights = tensors["response_mask"]
        if "loss_weights" in tensors:
            weights = weights * tensors["loss_weights"].float().unsqueeze(-1)
        tensors["token_weights"] = weights
        return tensors

    def _rl_loss(
        self, mb: dict[str, torch.Tensor], logprobs: torch.Tensor, old: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """verl's policy loss (+ KL) on one micro-batch, with the rollout importance weights."""
        algo = self.config.algorithm
        mask = mb["response_mask"]
        weights = mb["token_weights"]
        metrics: dict[str, float] = {}
        if "rollout_log_probs" in mb:
            weights, corrected = served_policy_correction(old, mb["rollout_log_probs"], mask, weights, algo)
            metrics.update(corrected)

        pg_loss, pg_metrics = self.policy_loss(
            old_log_prob=old,
            log_prob=logprobs,
            advantages=mb["advantages"],
            response_mask=mask,
            loss_agg_mode=algo.loss_agg_mode,
            config=self.actor_config,
            rollout_is_weights=weights,
        )
        metrics["pg_loss"] = pg_loss.item()
        metrics["pg_clipfrac"] = pg_metrics.get("actor/pg_clipfrac", 0.0)
        if self.reference is None:
            return pg_loss, metrics
        with torch.no_grad():
            ref_logprobs = self.response_logprobs(self.reference, mb)
        kl = kl_penalty(logprobs, ref_logprobs, algo.kl_penalty)
        kl_loss = agg_loss(kl, mask, algo.loss_agg_mode, **self.actor_config.global_batch_info)
        metrics["kl_loss"] = kl_loss.item()
        return pg_loss + algo.kl_coef * kl_loss, metrics

    def _optimizer_step(self) -> float:
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.optim.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.steps_done += 1
        return grad_norm.item()

    def sft_step(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor
    ) -> dict[str, float]:
        """One supervised step: token-mean cross-entropy on the `loss_mask` tokens of a right-padded batch."""
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        # Token t is predicted by the logits at t-1, so the loss mask moves with the targets.
        targets, target_mask = input_ids[:, 1:], loss_mask[:, 1:].to(self.device).float()
        n_tokens = target_mask.sum().clamp(min=1)
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for rows in _row_slices(len(input_ids), self.config.optim.micro_batch_size):
            logits = self.model(input_ids=input_ids[rows], attention_mask=attention_mask[rows]).logits[:, :-1]
            logprobs = verl_F.logprobs_from_logits(logits, targets[rows])
            # Normalized by the whole batch's tokens, so micro-batches accumulate to the full-batch loss.
            loss = agg_loss(-logprobs, target_mask[rows], "token-mean", batch_num_tokens=n_tokens)
            loss.backward()
            total += loss.item()
        grad_norm = self._optimizer_step()
        return {"loss": total, "grad_norm": grad_norm, "lr": self.scheduler.get_last_lr()[0]}

    def save(self, directory: Path) -> Path:
        """Write model + tokenizer + config as a safetensors folder that vLLM loads, or reloads in place."""
        directory = Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        # Write beside the target, then rename: a server reloading from `directory` never sees half a model.
        staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
        self.model.save_pretrained(staging, safe_serialization=True)
        self.tokenizer.save_pretrained(staging)
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(staging, directory)
        return directory

    def save_state(self, directory: Path) -> Path:
        """The optimizer, schedule and step count beside the weights: a resumed run continues exactly."""
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "steps_done": self.steps_done,
        }
        path = Path(directory) / TRAINER_STATE_FILE
        torch.save(state, path)
        return path

    def load_state(self, directory: Path) -> None:
        """Restore what save_state wrote; raises FileNotFoundError naming the file when it is missing."""
        state = torch.load(Path(directory) / TRAINER_STATE_FILE, weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.steps_done = state["steps_done"]

    def close(self) -> None:
        """Nothing to release: the model and optimizer live in this process (the TrainerBackend protocol)."""


def _row_slices(n: int, size: int) -> list[slice]:
    return [slice(start, start + size) for start in range(0, n, size)]
