"""The recipe for real weights (examples/coding/recipe-9b.yaml, docs/coding.md "On a cluster") is a config
`otel-rl train` accepts: read by the real loader, validated (verl's keys included), and saying what the
recipe says in the settings training uses."""

from pathlib import Path

import pytest

from otel_rl.train.config import ConfigError, load_config
from otel_rl.train.verl.config import compose_config

RECIPE = Path(__file__).resolve().parents[1] / "examples" / "coding" / "recipe-9b.yaml"


def test_the_recipe_validates_and_sets_the_reference_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    # its 16 ranks over 2 nodes run on a Ray cluster someone started: only their split is checked then
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    config = load_config(RECIPE)
    algo = config.algorithm
    assert (config.backend, config.device, config.world_size) == ("verl", "cuda", 16)
    assert (algo.advantage_estimator, algo.group_size, algo.kl_coef) == ("grpo", 8, 0.0)
    assert algo.clip_ratio_high > algo.clip_ratio_low  # asymmetric clipping
    assert algo.screen_flagged
    assert config.reward.trusted_sources == ["grader"]
    assert config.controller.backend == "kubernetes" and config.controller.coding is not None
    assert config.controller.coding.probe_k == 8 and config.controller.coding.reprobe_every > 0
    assert len(config.eval.harnesses) >= 4  # Pass@1 over at least 4 samples

    # what verl's engine runs with: no KL loss, no entropy bonus, the clip bounds, groups of 8, 2 nodes
    verl = compose_config(config.verl_settings(), config.verl)
    actor = verl.actor_rollout_ref.actor
    assert (actor.use_kl_loss, actor.entropy_coeff) == (False, 0.0)
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)
    assert verl.actor_rollout_ref.rollout.n == 8
    assert (verl.trainer.nnodes, verl.trainer.n_gpus_per_node) == (2, 8)


def test_without_a_ray_cluster_the_recipe_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError, match="RAY_ADDRESS"):
        load_config(RECIPE)
