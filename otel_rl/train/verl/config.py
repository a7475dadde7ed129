"""verl's own configuration for otel-rl's training settings: its `ppo_trainer.yaml`, composed with hydra as
verl composes it, then otel-rl's settings, then the user's `verl:` section.

Three layers, last wins: verl's defaults; what TrainConfig already says (TrainConfig.verl_settings: model,
optimizer, objective, seed, device: one setting, one place); the `verl:` section for everything otel-rl has
no setting of its own for (sharding, offload, micro-batching by tokens, the cluster's shape). The section is
checked before anything starts: every key must exist in verl's config, with a value of the default's type,
and none may restate a TrainConfig setting (two places for one setting drift apart). This module knows
nothing of TrainConfig: the config calls it to check its own `verl:` section.
"""

from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


@cache
def verl_defaults() -> DictConfig:
    """verl's `ppo_trainer.yaml` with its defaults list resolved (hydra compose); callers copy it."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name="ppo_trainer")


def compose_config(settings: dict[str, Any], overrides: dict[str, Any]) -> DictConfig:
    """verl's full config: its defaults, then otel-rl's `settings` (TrainConfig.verl_settings), then the
    `verl:` section's `overrides`."""
    # Merged over a plain copy: verl's composed config is in struct mode, where new keys (our
    # override_config.attn_implementation, fsdp_config.mixed_precision) are refused; then struct again.
    merged = OmegaConf.merge(OmegaConf.create(_defaults_tree()), settings, overrides)
    OmegaConf.set_struct(merged, True)
    return merged


def check_overrides(settings: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Raise ValueError("verl.<dotted.key>: ...") for the first unusable key of the `verl:` section
    (`overrides`), given otel-rl's `settings` in verl's names."""
    owned = _leaves(settings)
    # The cluster's shape is verl's to set (trainer.nnodes, trainer.n_gpus_per_node): not otel-rl's setting.
    owned = {key: value for key, value in owned.items() if not key.startswith("trainer.n")}
    _check(overrides, _defaults_tree(), "", owned)
    _check_dataclasses(compose_config(settings, overrides))


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
