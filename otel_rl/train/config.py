"""Training configuration: the typed settings of `otel-rl train`, read from YAML and validated up front."""

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from otel_rl.controller import defaults
from otel_rl.controller.backends import ControllerSection
from otel_rl.controller.environment import HarnessEnv

if TYPE_CHECKING:
    from otel_rl.transforms.rewards import RewardSpec


# Float32 everywhere on CPU: what the local backend computes in, so both give the same update; verl's
# engine otherwise computes in bf16 whatever `fsdp_config.dtype` says.
_FLOAT32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


class ConfigError(ValueError):
    """A training configuration that cannot be used; the message names the field and the problem."""


class _Section(BaseModel):
    # Unknown keys are errors: a misspelled option must not silently fall back to its default.
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(_Section):
    """Where the otel-rl server (collector, store, gateway, reload coordinator) listens."""

    url: str = "http://127.0.0.1:4318"
    token: str | None = None  # None: read `.otel_rl/token`, as written by `otel-rl serve`
    db: Path | None = None  # offline modes without a running server: read this DuckDB file instead
    vllm_urls: list[str] = []  # vLLM servers behind the gateway, when otel-rl starts the server itself


class OptimSettings(_Section):
    """AdamW, its learning-rate schedule and gradient accumulation."""

    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["constant", "cosine"] = "constant"  # cosine decays to 0 at `steps`
    max_grad_norm: float = Field(1.0, gt=0)
    micro_batch_size: int = Field(32, ge=1)  # samples per forward/backward; gradients accumulate to a step


class AlgorithmSettings(_Section):
    """The RL objective, named as in verl's `core_algos`."""

    # verl's outcome estimators over each group's rewards: grpo, grpo_no_std (Dr. GRPO) or rloo
    advantage_estimator: Literal["grpo", "grpo_no_std", "rloo"] = "grpo"
    policy_loss: str = "vanilla"  # any name verl's get_policy_loss_fn accepts; vanilla = PPO clip
    clip_ratio_low: float = Field(0.2, gt=0)
    clip_ratio_high: float = Field(0.2, gt=0)
    clip_ratio_c: float = Field(3.0, gt=1)  # dual-clip lower bound for negative advantages
    loss_agg_mode: Literal[
        "token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
    ] = "token-mean"
    rollout_is: Literal["token", "sequence"] | None = "token"  # IS against the recorded vLLM logprobs
    rollout_is_threshold: float = Field(2.0, gt=0)  # truncation of the IS weight (TIS)
    # a step whose mismatch (mean |trainer - recorded logprob|, nats per token) is above this logs a warning
    # naming the calls with the largest: float32 serving on-policy gives ~1e-6, bf16 ~5e-3
    mismatch_warning: float = Field(0.1, gt=0)
    kl_coef: float = Field(0.0, ge=0)  # KL to the initial policy; 0 loads no reference model
    kl_penalty: str = "low_var_kl"  # estimator name for verl's kl_penalty
    ppo_epochs: int = Field(1, ge=1)
    group_size: int = Field(8, ge=1)  # n rollouts per task in a group
    groups_per_step: int = Field(16, ge=1)  # B complete groups per update
    max_staleness: int = Field(1, ge=0)  # samples from policy versions older than current - this are dropped
    # leave the rollouts a hack detector flagged (the hack_flags view) out of the samples; False trains on
    # them as on any other (the coding demo's weak arm, the baseline screening is measured against)
    screen_flagged: bool = True

    @property
    def max_outstanding_groups(self) -> int:
        """The staleness bound on groups in flight: more could not all train within `max_staleness`."""
        return self.groups_per_step * (self.max_staleness + 1)


class RewardSettings(_Section):
    """Which `gen_ai.evaluation.result` events are the reward (otel_rl.transforms.RewardSpec)."""

    name: str = "outcome"  # gen_ai.evaluation.name
    rule: Literal["last", "mean", "max", "sum"] = "last"  # how several rewards of one rollout combine
    # Only these otel_rl.reward.source values count: the SDK's default inside a harness is "harness", which
    # the policy can steer; "grader" is an external grader (and /v1/rewards by default); "any" trusts every
    # source, and rewards sent without one.
    trusted_sources: list[str] = Field(["grader"], min_length=1)
    missing: float | None = None  # the reward of a rollout without one; None leaves the rollout out

    def spec(self) -> "RewardSpec":
        """The samples pipeline's reward selection for these settings."""
        from otel_rl.transforms.rewards import RewardSpec

        return RewardSpec(self.name, self.rule, tuple(self.trusted_sources), self.missing)


class OnlineSettings(_Section):
    """The harness the rollout controller runs, and how."""

    tasks: Path | None = None  # JSONL, one task per line
    harness: str | list[str] | None = None  # run once per rollout: argv, or a string for /bin/sh -c
    env: HarnessEnv = {}  # extra environment for every harness process
    # The controller's defaults (one definition: otel_rl/controller/defaults.py)
    concurrency: int = Field(defaults.CONCURRENCY, ge=1)
    # per rollout; the whole process group is killed after it
    timeout_s: float = Field(defaults.TIMEOUT_S, gt=0)
    # infrastructure failures are retried as new attempts
    max_attempts: int = Field(defaults.MAX_ATTEMPTS, ge=1)
    # Python harnesses: modules a fork server imports once, each rollout then forked from it (warm start)
    preload: list[str] = []
    nice: int = Field(0, ge=0, le=19)  # harnesses' scheduling priority: above 0 the trainer goes first


class EvalSettings(_Section):
    """Held-out evaluation: the same harness on the val tasks."""

    tasks: Path | None = None  # JSONL of val tasks; None disables evaluation
    every: int = Field(0, ge=0)  # steps between evaluations; 0: only before the first and after the last
    harness: str | list[str] | None = None  # the eval command (e.g. greedy flags); None: online.harness
    # Several evaluations at each point, by name (e.g. greedy and sampled); empty: one named "eval" above
    harnesses: dict[str, str | list[str]] = {}
    env: HarnessEnv = {}  # extra environment for eval runs, over online.env


class OfflineSettings(_Section):
    """Training from rollouts already in the store."""

    where: str | None = None  # SQL predicate over the `rollouts` view (offline RL)
    min_reward: float | None = None  # SFT keeps rollouts whose outcome reward is at least this (None: all)
    sft_batch_size: int = Field(32, ge=1)  # conversations per SFT step
    chats: Path | None = None  # SFT from this chat JSONL (OpenAI fine-tuning format) instead of the store


class TrainConfig(_Section):
    """Everything `otel-rl train` needs, online, offline or SFT."""

    model: Path  # Hugging Face folder (safetensors + tokenizer) of the starting policy
    output_dir: Path = Path(".otel_rl/train")  # checkpoints (step-N folders) and metrics
    steps: int = Field(20, ge=1)  # optimizer steps
    save_every: int = Field(1, ge=1)  # steps between checkpoints (online reloads need every step)
    seed: int = 0
    device: Literal["cpu", "cuda"] = "cpu"
    torch_threads: int = Field(1, ge=1)
    # Who runs the updates: otel-rl's own trainer (one device), or verl's engine (docs/verl.md)
    backend: Literal["local", "verl"] = "local"
    # backend verl: data-parallel ranks over all nodes (verl's nnodes × n_gpus_per_node; verl/world.py)
    world_size: int = Field(1, ge=1)
    # backend verl: the Ray cluster the ranks run on, its head's host:port (`ray start --head`); unset, the
    # RAY_ADDRESS environment variable, else Ray on this machine (verl/world.py, docs/verl.md)
    ray_address: str | None = None
    # backend verl: verl's own keys, merged over the config otel-rl composes from verl's ppo_trainer.yaml
    verl: dict[str, Any] = {}
    server: ServerSettings = ServerSettings()
    optim: OptimSettings = OptimSettings()
    algorithm: AlgorithmSettings = AlgorithmSettings()
    reward: RewardSettings = RewardSettings()
    online: OnlineSettings = OnlineSettings()
    eval: EvalSettings = EvalSettings()
    offline: OfflineSettings = OfflineSettings()
    # Where rollouts run: local processes, or Kubernetes Jobs (docs/controller.md)
    controller: ControllerSection = ControllerSection()

    @model_validator(mode="after")
    def _known_policy_loss(self) -> "TrainConfig":
        from verl.trainer.ppo.core_algos import get_policy_loss_fn

        try:
            get_policy_loss_fn(self.algorithm.policy_loss)
        except ValueError as e:
            raise ValueError(f"algorithm.policy_loss: {e}") from None
        return self

    @model_validator(mode="after")
    def _valid_verl_section(self) -> "TrainConfig":
        if self.backend != "verl":
            if self.verl:
                raise ValueError("verl: settings for verl's engine need `backend: verl`")
            if self.world_size > 1:
                raise ValueError("world_size: several ranks need `backend: verl`")
            if self.ray_address is not None:
                raise ValueError("ray_address: a Ray cluster runs verl's workers; it needs `backend: verl`")
            return self
        from otel_rl.train.verl.config import check_overrides
        from otel_rl.train.verl.world import check_ray_address, check_world_size

        if self.ray_address is not None:
            check_ray_address(self.ray_address)

        if "world_size" in self.model_fields_set and "n_gpus_per_node" in self._verl_shape():
            raise ValueError(
                "world_size: verl.trainer.n_gpus_per_node says the ranks too; set world_size only"
            )
        # its ValueError starts with the dotted key: "verl.trainer.nnodes: ..."
        check_overrides(self.verl_settings(), self.verl)
        shape = self._verl_shape()
        nnodes = shape.get("nnodes", 1)
        check_world_size(
            nnodes * shape["n_gpus_per_node"] if "n_gpus_per_node" in shape else self.world_size,
            nnodes,
            self.device,
            self.ray_address,
        )
        return self

    def _verl_shape(self) -> dict[str, int]:
        """The cluster's shape the verl: section sets (trainer.nnodes, trainer.n_gpus_per_node), if ints."""
        trainer = self.verl.get("trainer")
        if not isinstance(trainer, dict):
            return {}
        return {
            key: trainer[key] for key in ("nnodes", "n_gpus_per_node") if isinstance(trainer.get(key), int)
        }

    def verl_settings(self) -> dict[str, Any]:
        """What these settings set in verl's config (backend verl), in its names: one setting, one place."""
        optim, algo = self.optim, self.algorithm
        nnodes = self._verl_shape().get("nnodes", 1)
        fsdp = {"seed": self.seed, "use_torch_compile": False}
        if self.device == "cpu":
            # FSDP1 hard-codes sync_module_states=True, which torch refuses for CPU modules: fsdp2 on CPU.
            fsdp |= {"strategy": "fsdp2", "dtype": "float32", "mixed_precision": _FLOAT32}
        actor = {
            "ppo_micro_batch_size_per_gpu": optim.micro_batch_size,
            "ppo_epochs": algo.ppo_epochs,
            "clip_ratio": algo.clip_ratio_low,
            "clip_ratio_low": algo.clip_ratio_low,
            "clip_ratio_high": algo.clip_ratio_high,
            "clip_ratio_c": algo.clip_ratio_c,
            "loss_agg_mode": algo.loss_agg_mode,
            "policy_loss": {"loss_mode": algo.policy_loss},
            "use_kl_loss": algo.kl_coef > 0,
            "kl_loss_coef": algo.kl_coef,
            "kl_loss_type": algo.kl_penalty,
            "entropy_coeff": 0.0,
            "use_torch_compile": False,
            "data_loader_seed": self.seed,
            "optim": {
                "lr": optim.lr,
                "weight_decay": optim.weight_decay,
                "clip_grad": optim.max_grad_norm,
                "total_training_steps": self.steps,
                **_verl_schedule(optim),
            },
            "fsdp_config": fsdp,
            # hf_model: the Hugging Face export save() hands to vLLM; loading needs only the sharded state.
            "checkpoint": {
                "save_contents": ["model", "optimizer", "extra", "hf_model"],
                "load_contents": ["model", "optimizer", "extra"],
            },
        }
        model: dict[str, Any] = {"path": str(self.model)}
        if self.device == "cpu":
            actor["strategy"] = "fsdp2"
            # No flash attention on CPU; padded micro-batches (packing needs varlen attention kernels).
            model |= {
                "override_config": {"attn_implementation": "sdpa"},
                "use_remove_padding": False,
                "enable_gradient_checkpointing": False,
            }
        return {
            "actor_rollout_ref": {
                "model": model,
                "actor": actor,
                "ref": {"fsdp_config": fsdp, "log_prob_micro_batch_size_per_gpu": optim.micro_batch_size},
                "rollout": {
                    "n": algo.group_size,
                    "log_prob_micro_batch_size_per_gpu": optim.micro_batch_size,
                },
            },
            # ranks per node: world_size over the verl: section's nnodes (check_world_size: they divide)
            "trainer": {
                "device": self.device,
                "nnodes": 1,
                "n_gpus_per_node": max(1, self.world_size // nnodes),
            },
        }

    def require_online(self) -> None:
        """Raise ConfigError unless the online loop has what it needs."""
        if self.online.tasks is None or not self.online.harness:
            raise ConfigError(
                "online training needs `online.tasks` (a JSONL file) and `online.harness` (argv)"
            )
        _require_file(self.online.tasks, "online.tasks")
        if self.eval.tasks is not None:
            _require_file(self.eval.tasks, "eval.tasks")

    def require_sft(self) -> None:
        """Raise ConfigError unless the backend can fine-tune."""
        if self.backend == "verl":
            raise ConfigError(
                "SFT needs `backend: local`: the verl backend runs RL updates only (verl's own SFT trainer "
                "reads its own dataset files, not otel-rl's conversations; docs/verl.md)"
            )

    def require_offline(self) -> None:
        """Raise ConfigError unless offline RL has its rollout filter."""
        if not self.offline.where:
            raise ConfigError("offline RL needs a rollout filter: `--where` or `offline.where`")


def _verl_schedule(optim: OptimSettings) -> dict[str, Any]:
    """otel-rl's schedule in verl's scheduler. The local backend's warm-up is (step + 1) / warmup_steps, its
    first step already moves; verl's constant schedule starts at 0 (a first step that changes nothing).
    verl's cosine schedule with `zero_indexed_step: false` has otel-rl's warm-up, and with `num_cycles: 0`
    it stays at the full rate after it: otel-rl's constant schedule exactly. otel-rl's cosine maps to
    verl's cosine, whose decay runs one step ahead of the local backend's (verl's own definition)."""
    cycles = 0.0 if optim.schedule == "constant" else 0.5
    return {
        "lr_scheduler_type": "cosine",
        "lr_warmup_steps": optim.warmup_steps,
        "zero_indexed_step": False,
        "num_cycles": cycles,
        "min_lr_ratio": 0.0,
    }


def _require_file(path: Path, field: str) -> None:
    if not path.is_file():
        raise ConfigError(f"{field}: no such file {path}")


def load_config(path: Path, overrides: dict | None = None) -> TrainConfig:
    """Read a YAML training config, apply `overrides` (nested dicts, e.g. from CLI flags), validate it."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"no such config file: {path}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of settings")
    return config_from_dict(_merge(data, overrides or {}), source=str(path))


def config_from_dict(data: dict, source: str = "config") -> TrainConfig:
    """Validate a config mapping; errors name every offending field."""
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(_describe(err) for err in e.errors())
        raise ConfigError(f"{source}: {problems}") from None


def _describe(error: dict) -> str:
    where = ".".join(map(str, error["loc"]))
    message = error["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def _merge(base: dict, overrides: dict) -> dict:
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged
