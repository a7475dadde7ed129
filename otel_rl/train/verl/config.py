"""verl's own configuration for otel-rl's training settings: its `ppo_trainer.yaml`, composed with hydra as
verl composes it, then otel-rl's settings, then the user's `verl:` section.

Three layers, last wins: verl's defaults; what TrainConfig already says (model, optimizer, objective, seed,
device: one setting, one place); the `verl:` section for everything otel-rl has no setting of its own for
(sharding, offload, micro-batching by tokens, the cluster's shape). The section is checked before anything
starts: every key must exist in verl's config, with a value of the default's type, and none may restate a
TrainConfig setting (two places for one setting drift apart).
"""

from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from otel_rl.train.config import TrainConfig

# Float32 everywhere on CPU: what the local backend computes in, so both give the same update; verl's
# engine otherwise computes in bf16 whatever `fsdp_config.dtype` says.
_FLOAT32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


@cache
def verl_defaults() -> DictConfig:
    """verl's `ppo_trainer.yaml` with its defaults list resolved (hydra compose); callers copy it."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name="ppo_trainer")


def otel_rl_settings(config: TrainConfig) -> dict[str, Any]:
    """The verl keys that TrainConfig decides, in verl's names."""
    optim, algo = config.optim, config.algorithm
    fsdp = {"seed": config.seed, "use_torch_compile": False}
    if config.device == "cpu":
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
        "data_loader_seed": config.seed,
        "optim": {
            "lr": optim.lr,
            "weight_decay": optim.weight_decay,
            "clip_grad": optim.max_grad_norm,
            "total_training_steps": config.steps,
            **_schedule(config),
        },
        "fsdp_config": fsdp,
        # hf_model: the Hugging Face export save() hands to vLLM; loading needs only the sharded state.
        "checkpoint": {
            "save_contents": ["model", "optimizer", "extra", "hf_model"],
            "load_contents": ["model", "optimizer", "extra"],
        },
    }
    model: dict[str, Any] = {"path": str(config.model)}
    if config.device == "cpu":
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
            "rollout": {"n": algo.group_size, "log_prob_micro_batch_size_per_gpu": optim.micro_batch_size},
        },
        "trainer": {"device": config.device, "nnodes": 1, "n_gpus_per_node": 1},
    }


def _schedule(config: TrainConfig) -> dict[str, Any]:
    """otel-rl's schedule in verl's scheduler. The local backend's warm-up is (step + 1) / warmup_steps, its
    first step already moves; verl's constant schedule starts at 0 (a first step that changes nothing).
    verl's cosine schedule with `zero_indexed_step: false` has otel-rl's warm-up, and with `num_cycles: 0`
    it stays at the full rate after it: otel-rl's constant schedule exactly. otel-rl's cosine maps to
    verl's cosine, whose decay runs one step ahead of the local backend's (verl's own definition)."""
    cycles = 0.0 if config.optim.schedule == "constant" else 0.5
    return {
        "lr_scheduler_type": "cosine",
        "lr_warmup_steps": config.optim.warmup_steps,
        "zero_indexed_step": False,
        "num_cycles": cycles,
        "min_lr_ratio": 0.0,
    }


def compose_config(config: TrainConfig) -> DictConfig:
    """verl's full config for `config`: defaults, then otel-rl's settings, then the `verl:` section."""
    # Merged over a plain copy: verl's composed config is in struct mode, where new keys (our
    # override_config.attn_implementation, fsdp_config.mixed_precision) are refused; then struct again.
    merged = OmegaConf.merge(OmegaConf.create(_defaults_tree()), otel_rl_settings(config), config.verl)
    OmegaConf.set_struct(merged, True)
    return merged


def check_overrides(config: TrainConfig) -> None:
    """Raise ValueError("verl.<dotted.key>: ...") for the first unusable key of `config.verl`."""
    owned = _leaves(otel_rl_settings(config))
    # The cluster's shape is verl's to set (trainer.nnodes, trainer.n_gpus_per_node): not otel-rl's setting.
    owned = {key: value for key, value in owned.items() if not key.startswith("trainer.n")}
    _check(config.verl, _defaults_tree(), "", owned)
    composed = compose_config(config)
    _check_dataclasses(composed)


@cache
def _defaults_tree() -> dict[str, Any]:
    return OmegaConf.to_container(verl_defaults(), resolve=False)  # interpolations kept as written


def _check(section: Any, defaults: dict[str, Any], prefix: str, owned: dict[str, Any]) -> None:
    if not isinstance(section, dict):
        raise ValueError(f"verl{prefix}: must be a mapping of verl's keys, got {type(section).__name__}")
    for key, value in section.items():
        dotted = f"{prefix}.{key}"
        if not isinstance(key, str) or key not in defaults:
            raise ValueError(f"verl{dotted}: verl's ppo_trainer.yaml has no such key")
        if dotted[1:] in owned:
            raise ValueError(
                f"verl{dotted}: otel-rl sets it from its own settings (model, optim, algorithm, seed, "
                "device: docs/verl.md#configuration); change it there"
            )
        default = defaults[key]
        if isinstance(default, dict):
            _check(value, default, dotted, owned)
        elif default is not None and value is not None and not _same_kind(default, value):
            raise ValueError(
                f"verl{dotted}: expected {type(default).__name__} like the default {default!r}, got {value!r}"
            )


def _same_kind(default: Any, value: Any) -> bool:
    if isinstance(default, str) and default.startswith("${"):
        return True  # an interpolation: its type is the referenced key's, checked by the dataclasses
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, int | float)
    return isinstance(value, type(default))


def _check_dataclasses(composed: DictConfig) -> None:
    """Build verl's config dataclasses as its workers will: their own checks name the section."""
    from verl.utils.config import omega_conf_to_dataclass

    for section in ("actor_rollout_ref.actor", "algorithm"):
        try:
            omega_conf_to_dataclass(OmegaConf.select(composed, section))
        except Exception as e:  # verl raises assertions, ValueErrors and OmegaConf errors alike
            cause = e.__cause__ or e  # hydra wraps the dataclass's own error
            message = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
            raise ValueError(f"verl.{section}: {message}") from None


def _leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    leaves: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and key not in {"mixed_precision", "override_config"}:
            leaves |= _leaves(value, f"{prefix}{key}.")
        else:
            leaves[f"{prefix}{key}"] = value
    return leaves
