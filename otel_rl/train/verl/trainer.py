"""The verl backend: verl's own actor worker (FSDP2 engine, its PPO loss, its optimizer and checkpoints) on a
Ray worker group, fed otel-rl's batches the way verl's trainer feeds its own.

otel-rl's loop keeps what it owns (rollouts through the controller and the gateway, rewards, advantages);
verl's workers do the update. Each `step` is what `RayPPOTrainer` does with a batch once its rollouts are
done: DataProto -> TensorDict -> no-padding layout; the actor's log-probs before the update (the PPO "old"
policy: with one epoch, the update's own forward gives them, losses.py); the reference policy's, when a KL
term is on; the importance weights against the logprobs vLLM recorded (verl's rollout-correction helper);
then `update_actor`. On a laptop the worker group is `world_size` CPU processes on gloo (platform.py,
world.py), each a slice of the batch; on a cluster the same code gets GPU pools from `trainer.nnodes` and
`trainer.n_gpus_per_node`.
"""

import os
import shutil
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer
from verl import DataProto
from verl.utils import tensordict_utils as tu
from verl.utils.model import compute_position_id_with_mask
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

from otel_rl.train.config import TrainConfig
from otel_rl.train.correction import served_policy_correction, warn_on_mismatch
from otel_rl.train.trainer import RL_BATCH_KEYS
from otel_rl.train.verl.config import compose_config
from otel_rl.train.verl.platform import worker_env
from otel_rl.train.verl.world import check_cluster_holds, check_ray_answers, ray_cluster

CHECKPOINT_DIR = "verl_checkpoint"  # verl's sharded model, optimizer and scheduler state, beside the weights
# What goes to the workers: verl's names; the rest of a batch (uids, rewards, scores) stays here.
_WORKER_KEYS = ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask")


class VerlTrainer:
    """A TrainerBackend whose updates run in verl's ActorRolloutRefWorker (worker.py: role "actor", plus a
    reference group when `algorithm.kl_coef > 0`), on Ray this object starts and stops, or on the Ray
    cluster of `ray_address` (or RAY_ADDRESS), which it joins and leaves."""

    def __init__(self, config: TrainConfig):
        self.config = config
        self.verl_config = compose_config(config.verl_settings(), config.verl)
        self._workdir = Path(tempfile.mkdtemp(prefix="otel-rl-verl-"))
        self._saved: Path | None = None  # the checkpoint of the last save(), until save_state takes it
        self.steps_done = 0
        started = time.perf_counter()
        try:
            self._start_ray()  # first: a cluster that does not answer or cannot hold the ranks stops here
            self.tokenizer = AutoTokenizer.from_pretrained(config.model)
            self.pad_token_id = self.tokenizer.pad_token_id
            self._pool = self._resource_pool()
            self.actor = self._worker_group("actor")
            reference = config.algorithm.kl_coef > 0
            self.ref = self._worker_group(self._reference_role()) if reference else None
            self.single_epoch = config.algorithm.ppo_epochs == 1
            if self.single_epoch:
                self.actor.set_loss_fn(loss_fn=self._single_epoch_loss())
        except BaseException:
            self.close()
            raise
        self.startup_s = time.perf_counter() - started  # Ray and the workers' model load, reported by bench/

    def _start_ray(self) -> None:
        """Join the Ray cluster of `ray_address` (else RAY_ADDRESS) once it answers and holds the ranks
        (world.py), or start Ray on this machine: a CPU a worker, no dashboard, a temp folder of its own."""
        import ray

        cluster = ray_cluster(self.config.ray_address)
        if cluster is None:
            ray.init(
                num_cpus=self.world_size * self._groups(),
                include_dashboard=False,
                _temp_dir=str(self._workdir / "ray"),
                log_to_driver=False,
            )
            return
        address, name = cluster
        check_ray_answers(address, name)
        try:
            ray.init(address=address, log_to_driver=False)  # a cluster someone started: joined, not owned
        except ConnectionError as error:  # something answered gRPC there, but not a Ray head
            raise ValueError(f"{name}: no Ray cluster answers at {address} ({error})") from None
        trainer = self.verl_config.trainer
        nnodes, per_node = int(trainer.nnodes), int(trainer.n_gpus_per_node)
        check_cluster_holds(ray.nodes(), name, address, nnodes, per_node, self.config.device, self._groups())

    def _single_epoch_loss(self) -> Any:
        from verl.utils.config import omega_conf_to_dataclass

        from otel_rl.train.verl.losses import single_epoch_ppo_loss

        algo = self.config.algorithm
        return partial(
            single_epoch_ppo_loss,
            config=omega_conf_to_dataclass(self.verl_config.actor_rollout_ref.actor),
            rollout_is=algo.rollout_is,
            rollout_is_threshold=algo.rollout_is_threshold,
        )

    def _reference_role(self) -> str:
        # verl's "ref" role builds a forward-only engine, and FSDP2 forward-only engines offload with
        # CPUOffloadPolicy(pin_memory=True), which torch refuses without an accelerator (FSDPEngine.
        # _build_fsdp_module: "Cannot access accelerator device when none is available"). On CPU the
        # reference is therefore an "actor" worker that is never updated: the same engine and log-probs.
        return "actor" if self.config.device == "cpu" else "ref"

    @property
    def world_size(self) -> int:
        """verl's data-parallel ranks, over all nodes (world.py)."""
        trainer = self.verl_config.trainer
        return int(trainer.nnodes) * int(trainer.n_gpus_per_node)

    def _groups(self) -> int:
        return 2 if self.config.algorithm.kl_coef > 0 else 1

    def _resource_pool(self) -> Any:
        """One bundle per device (per CPU process on a laptop), shared by the actor and reference groups:
        each worker takes 1/groups of its device, so both fit where one actor would."""
        from verl.single_controller.ray import RayResourcePool

        trainer = self.verl_config.trainer
        return RayResourcePool(
            process_on_nodes=[int(trainer.n_gpus_per_node)] * int(trainer.nnodes),
            use_gpu=self.config.device != "cpu",
            max_colocate_count=self._groups(),  # also the bundle's CPUs: the laptop's Ray has a few
        )

    def _worker_group(self, role: str) -> Any:
        import ray
        from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup

        from otel_rl.train.verl.worker import ActorRefWorker

        on_cpu = self.config.device == "cpu"
        worker = RayClassWithInitArgs(
            cls=ray.remote(ActorRefWorker), config=self.verl_config.actor_rollout_ref, role=role
        )
        group = RayWorkerGroup(
            resource_pool=self._pool,
            ray_cls_with_init=worker,
            device_name="cpu" if on_cpu else "cuda",
            worker_env=worker_env(self.config.torch_threads) if on_cpu else {},
        )
        group.init_model()
        return group

    def step(self, batch: DataProto) -> dict[str, float]:
        """One policy update on a batch of samples (prompts left-padded, responses right-padded)."""
        batch = worker_batch(batch)
        response_mask = batch.batch["response_mask"].float()
        n_tokens = response_mask.sum().clamp(min=1).item()
        samples = len(batch)
        batch = pad_to_ranks(batch, self.world_size)
        # One epoch: the update's own forward gives the old log-probs and IS weights (losses.py).
        metrics = {} if self.single_epoch else self._old_policy(batch)
        if self.ref is not None:
            reference = (
                self.ref.compute_log_prob if self.config.device == "cpu" else self.ref.compute_ref_log_prob
            )
            batch.batch["ref_log_prob"] = self._log_probs(reference, batch)

        output = self.actor.update_actor(self._update_input(batch))
        verl_metrics = tu.get(output, "metrics")
        self.steps_done += 1
        metrics |= {
            name: _mean(verl_metrics[name]) for name in ("mismatch", "is_weight_mean") if name in verl_metrics
        }
        metrics |= {
            "pg_loss": _mean(verl_metrics["actor/pg_loss"]),
            "pg_clipfrac": _mean(verl_metrics.get("actor/pg_clipfrac", [0.0])),
            "loss": _mean(verl_metrics["loss"]),
            # per PPO epoch: losses are averaged over epochs, the norm and rate are the last epoch's
            "grad_norm": _last(verl_metrics["grad_norm"]),
            "lr": _last(verl_metrics["lr"]),
            "samples": float(samples),
            "response_tokens": float(n_tokens),
        }
        if "kl_loss" in verl_metrics:
            metrics["kl_loss"] = _mean(verl_metrics["kl_loss"])
        return metrics

    def _old_policy(self, batch: DataProto) -> dict[str, float]:
        """Several PPO epochs: the actor's log-probs before the update (verl's compute_log_prob), and the IS
        weights against vLLM's logprobs from them, into the batch; the mismatch metrics."""
        algo = self.config.algorithm
        response_mask = batch.batch["response_mask"].float()
        metrics: dict[str, float] = {}
        old = self._log_probs(self.actor.compute_log_prob, batch)
        batch.batch["old_log_probs"] = old
        weights = batch.batch.pop("token_weights")
        if "rollout_log_probs" in batch.batch:
            served = batch.batch.pop("rollout_log_probs")
            weights, corrected = served_policy_correction(old, served, response_mask, weights, algo)
            metrics.update(corrected)
            warn_on_mismatch(old, served, response_mask, batch.non_tensor_batch, algo.mismatch_warning)
        # Our per-sample loss weights ride in verl's rollout_is_weights: its loss multiplies each token by it.
        batch.batch["rollout_is_weights"] = weights
        return metrics

    def _log_probs(self, method: Any, batch: DataProto) -> torch.Tensor:
        """Log-probs of the responses, from the actor or the reference group (ray_trainer's recipe)."""
        data = left_right_2_no_padding(batch.to_tensordict())
        tu.assign_non_tensor(
            data,
            calculate_entropy=False,
            compute_loss=False,
            micro_batch_size_per_gpu=self._micro_batch(batch),
        )
        output = method(data)
        return no_padding_2_padding(tu.get(output, "log_probs"), data).float()

    def _update_input(self, batch: DataProto) -> Any:
        """The batch as `update_actor` takes it: one mini-batch (one optimizer step) per PPO epoch."""
        data = left_right_2_no_padding(batch.to_tensordict())
        mask = batch.batch["response_mask"]
        tu.assign_non_tensor(
            data,
            calculate_entropy=False,
            distillation_use_topk=False,
            distillation_only=False,
            # Normalized by the whole batch: sequences with response tokens, as the local backend counts.
            global_batch_size=int((mask.sum(-1) > 0).sum().clamp(min=1).item()),
            mini_batch_size=len(batch),
            epochs=self.config.algorithm.ppo_epochs,
            seed=self.config.seed,
            dataloader_kwargs={"shuffle": False},
            compute_loss=True,
            micro_batch_size_per_gpu=self._micro_batch(batch),
        )
        return data

    def _micro_batch(self, batch: DataProto) -> int:
        """The largest micro-batch within `optim.micro_batch_size` that divides a rank's share of the batch:
        verl's engine splits a rank's slice into equal micro-batches only. Gradients accumulate to the whole
        batch's either way (the loss is normalized by the whole batch, over all ranks), so only memory and
        speed depend on it."""
        share = len(batch) // self.world_size
        size = min(self.config.optim.micro_batch_size, share)
        while share % size:
            size -= 1
        return size

    def sft_step(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor
    ) -> dict[str, float]:
        """Not with this backend: verl's SFT runs its own trainer over its own dataset (sft_trainer)."""
        raise NotImplementedError(
            "backend verl trains RL updates only; run SFT with backend local (docs/verl.md)"
        )

    def save(self, directory: Path) -> Path:
        """verl's checkpoint: its Hugging Face export becomes `directory` (what vLLM loads); the sharded
        state stays aside until save_state puts it beside the weights."""
        directory = Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        checkpoint = Path(tempfile.mkdtemp(prefix="checkpoint-", dir=self._workdir))
        self.actor.save_checkpoint(str(checkpoint), global_step=self.steps_done)
        # The export is written beside the target, then renamed: a reloading server never sees half a model.
        staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
        shutil.move(checkpoint / "huggingface", staging / "weights")
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(staging / "weights", directory)
        staging.rmdir()
        if self._saved is not None:
            shutil.rmtree(self._saved, ignore_errors=True)
        self._saved = checkpoint
        return directory

    def save_state(self, directory: Path) -> Path:
        """verl's sharded model, optimizer and scheduler state, in `directory`/verl_checkpoint."""
        target = Path(directory) / CHECKPOINT_DIR
        if self._saved is None:  # no save() since the last update: take a fresh checkpoint
            self._saved = Path(tempfile.mkdtemp(prefix="checkpoint-", dir=self._workdir))
            self.actor.save_checkpoint(str(self._saved), global_step=self.steps_done)
        if target.exists():
            shutil.rmtree(target)
        (self._saved / "steps_done").write_text(str(self.steps_done))
        shutil.move(self._saved, target)
        self._saved = None
        return target

    def load_state(self, directory: Path) -> None:
        """Restore what save_state wrote; raises FileNotFoundError naming the folder when it is missing."""
        source = Path(directory) / CHECKPOINT_DIR
        if not source.is_dir():
            raise FileNotFoundError(f"no verl checkpoint in {source}")
        self.actor.load_checkpoint(str(source))
        self.steps_done = int((source / "steps_done").read_text()) if (source / "steps_done").exists() else 0

    def close(self) -> None:
        """Stop the workers and the Ray this trainer started (or leave the cluster it joined); remove its
        scratch folder."""
        import ray

        ray.shutdown()
        shutil.rmtree(self._workdir, ignore_errors=True)


def worker_batch(batch: DataProto) -> DataProto:
    """otel-rl's batch (to_dataproto) in verl's names, with what the update needs derived on the driver:
    position ids, prompts, per-token loss weights."""
    missing = [key for key in RL_BATCH_KEYS if key not in batch.batch]
    if missing:
        raise ValueError(f"the batch lacks {missing}; build it with otel_rl.transforms.to_dataproto")
    tensors = {key: batch.batch[key] for key in _WORKER_KEYS + ("advantages",) if key in batch.batch}
    if "position_ids" not in tensors:
        tensors["position_ids"] = compute_position_id_with_mask(tensors["attention_mask"])
    if "prompts" not in tensors:
        width = tensors["input_ids"].shape[1] - tensors["responses"].shape[1]
        tensors["prompts"] = tensors["input_ids"][:, :width]
    tensors["advantages"] = tensors["advantages"].float()
    # A rollout split into several segments counts once: each segment's tokens carry its share.
    weights = tensors["response_mask"].float()
    if "loss_weights" in batch.batch:
        weights = weights * batch.batch["loss_weights"].float().unsqueeze(-1)
    tensors["token_weights"] = weights
    if "rollout_log_probs" in batch.batch:
        tensors["rollout_log_probs"] = batch.batch["rollout_log_probs"].float()
    # logits / temperature: 1, the logprobs of the distribution vLLM sampled from and recorded
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})


def pad_to_ranks(batch: DataProto, ranks: int) -> DataProto:
    """The batch with as many rows as a multiple of `ranks`: verl's dispatch gives each rank an equal,
    contiguous slice. The added rows repeat the first ones with no loss tokens (response mask and loss
    weights 0), so they add nothing to the loss, its token count or the sequences it is normalized by."""
    missing = -len(batch) % ranks
    if not missing:
        return batch
    extra = batch.select_idxs([i % len(batch) for i in range(missing)])
    for key in ("response_mask", "token_weights"):
        extra.batch[key] = torch.zeros_like(extra.batch[key])
    return DataProto.concat([batch, extra])


def to_worker_input(batch: DataProto) -> Any:
    """The whole pipeline from otel-rl's batch to the no-padding TensorDict verl's workers take."""
    return left_right_2_no_padding(worker_batch(batch).to_tensordict())


def _last(values: Any) -> float:
    return float(values[-1]) if isinstance(values, list | tuple) else float(values)


def _mean(values: Any) -> float:
    if isinstance(values, list | tuple):
        return float(sum(float(v) for v in values) / max(1, len(values)))
    return float(values)
