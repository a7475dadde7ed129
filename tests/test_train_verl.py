"""The verl backend: verl's own actor and reference workers (FSDP2 on a CPU Ray worker group) give the
local backend's update on the same batch, save a folder transformers reloads, resume their optimizer, and
a bad `verl:` key is named before anything starts.

One scenario runs once for the module (starting Ray and verl's workers costs most of its time) and the
tests check its parts.
"""

import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pytest
import torch
from transformers import AutoModelForCausalLM

from otel_rl.train.config import ConfigError, config_from_dict
from otel_rl.train.trainer import Trainer
from otel_rl.train.verl import VerlTrainer
from otel_rl.train.verl.config import check_overrides
from otel_rl.transforms.advantages import rollout_advantages
from otel_rl.transforms.export import to_dataproto

sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
import calc_task  # noqa: E402

TOLERANCE = 1e-5
COMPARED = ("loss", "pg_loss", "kl_loss", "grad_norm", "lr", "mismatch", "is_weight_mean", "response_tokens")


def settings(model: Path, **overrides) -> dict:
    # Three micro-batches (3, 3, 2), the KL term on (a reference worker group), off-policy samples
    # corrected by truncated IS, a warm-up schedule: every part of the update both backends compute.
    return {
        "model": str(model),
        "seed": 0,
        "steps": 4,
        "optim": {"lr": 1e-3, "micro_batch_size": 3, "warmup_steps": 2},
        "algorithm": {"kl_coef": 0.5, "rollout_is": "token", "rollout_is_threshold": 2.0},
        **overrides,
    }


def rows(tokenizer) -> pl.DataFrame:
    """Eight rollouts in two GRPO groups: calculator prompts, one multi-turn response whose tool-result
    tokens are masked out, and one rollout split in two segments (loss weight 0.5 each)."""
    rng = random.Random(0)
    tasks = calc_task.sample_tasks(calc_task.split_problems(0)[0], 8, "train", seed=0)
    out = []
    for i, task in enumerate(tasks):
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": task["question"]}], add_generation_prompt=True
        )["input_ids"]
        response = tokenizer(f"The answer is {rng.randint(10, 999)}.<|im_end|>")["input_ids"]
        mask = [1] * len(response)
        if i == 0:
            result = tokenizer("\n<|im_start|>tool\n85<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
            response, mask = response + result + response, mask + [0] * len(result) + mask
        out.append(
            {
                "segment_id": f"s{i}",
                "rollout_id": "r1" if i == 2 else f"r{i}",
                "group_id": "g1" if i < 4 else "g2",
                "prompt_ids": prompt,
                "response_ids": response,
                "response_mask": mask,
                "reward": float(i % 3 == 0),
                "loss_weight": 0.5 if i in (1, 2) else 1.0,
            }
        )
    frame = pl.DataFrame(out)
    advantages = rollout_advantages(
        frame.select("rollout_id", "group_id", "reward").unique("rollout_id"), "grpo"
    )
    return frame.join(advantages.select("rollout_id", "advantage"), on="rollout_id")


def served_batch(trainer: Trainer, frame: pl.DataFrame):
    """The batch with vLLM-style recorded logprobs that differ from the policy's (stale sampling)."""
    empty = pl.Series([[]] * frame.height, dtype=pl.List(pl.Float64))
    probe = to_dataproto(frame.with_columns(rollout_logprobs=empty, has_logprobs=pl.lit(False)), 0)
    with torch.no_grad():
        own = trainer.response_logprobs(trainer.model, {k: probe.batch[k] for k in probe.batch.keys()})  # noqa: SIM118
    served = own + torch.linspace(-1.0, 1.0, own.numel()).reshape(own.shape)
    lengths = frame["response_ids"].list.len().to_list()
    recorded = [
        [v * m for v, m in zip(served[i, :n].tolist(), mask, strict=True)]
        for i, (n, mask) in enumerate(zip(lengths, frame["response_mask"].to_list(), strict=True))
    ]
    with_logprobs = frame.with_columns(rollout_logprobs=pl.Series(recorded), has_logprobs=pl.lit(True))
    return to_dataproto(with_logprobs, trainer.tokenizer.pad_token_id)


@dataclass
class Scenario:
    local: list[dict] = field(default_factory=list)  # the local backend's metrics, step by step
    verl: list[dict] = field(default_factory=list)
    local_weights: dict[str, torch.Tensor] = field(default_factory=dict)  # after the compared steps
    saved: Path | None = None  # verl's save() after the compared steps
    continued: dict = field(default_factory=dict)  # verl's next step, straight on
    resumed: dict = field(default_factory=dict)  # the same step after load_state of the checkpoint
    startup_s: float = 0.0


@pytest.fixture(scope="module")
def scenario(tiny_model_dir, tmp_path_factory) -> Scenario:
    config = config_from_dict(settings(tiny_model_dir))
    local = Trainer(config)
    batch = served_batch(local, rows(local.tokenizer))
    result = Scenario()
    verl = VerlTrainer(config.model_copy(update={"backend": "verl"}))
    try:
        result.startup_s = verl.startup_s
        for _ in range(2):  # the second step: the policy has moved, so the KL term and the schedule count
            result.local.append(local.step(batch))
            result.verl.append(verl.step(batch))
        result.local_weights = {k: v.detach().clone() for k, v in local.model.state_dict().items()}
        result.saved = verl.save(tmp_path_factory.mktemp("verl") / "step-2")
        verl.save_state(result.saved)
        result.continued = verl.step(batch)
        verl.load_state(result.saved)
        result.resumed = verl.step(batch)
    finally:
        verl.close()
    return result


def test_verls_workers_give_the_local_backends_update_on_the_same_batch(scenario):
    for local, verl in zip(scenario.local, scenario.verl, strict=True):
        for name in COMPARED:
            assert verl[name] == pytest.approx(local[name], abs=TOLERANCE), name
    assert scenario.verl[1]["kl_loss"] > 1e-4  # the reference worker's logprobs entered the second update
    assert scenario.verl[0]["is_weight_mean"] != pytest.approx(1.0)  # the IS correction was active


def test_the_saved_folder_reloads_in_transformers_with_the_local_backends_weights_and_logprobs(
    scenario, tiny_model_dir
):
    reloaded = AutoModelForCausalLM.from_pretrained(scenario.saved, dtype=torch.float32)
    # Adam's early steps move each weight by ~lr whatever its gradient's size, so float noise in a tiny
    # gradient entry can move a weight by a fraction of lr (1e-3): weights to lr/10, logprobs to 1e-5.
    for name, tensor in reloaded.state_dict().items():
        torch.testing.assert_close(tensor, scenario.local_weights[name], atol=1e-4, rtol=0)
    assert (scenario.saved / "tokenizer.json").is_file() and (scenario.saved / "config.json").is_file()
    local = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    local.load_state_dict(scenario.local_weights)
    ids = torch.tensor([[5, 17, 42, 99, 3, 64, 8]])
    with torch.no_grad():
        ours, theirs = (m(input_ids=ids).logits.log_softmax(-1) for m in (reloaded, local))
    torch.testing.assert_close(ours, theirs, atol=TOLERANCE, rtol=0)


def test_load_state_resumes_verls_optimizer_and_schedule_exactly(scenario):
    for name in ("loss", "grad_norm", "lr", "kl_loss"):
        assert scenario.resumed[name] == pytest.approx(scenario.continued[name], abs=1e-6), name
    assert scenario.continued["lr"] == pytest.approx(1e-3)  # past the warm-up: the schedule was restored


def test_several_ppo_epochs_take_the_old_policy_from_verls_compute_log_prob(tiny_model_dir):
    """Two epochs (the old log-probs from a forward before the update, not from the update's own), no KL,
    a batch of 8 in micro-batches of 4: the same update as the local backend's."""
    config = config_from_dict(
        settings(tiny_model_dir, algorithm={"ppo_epochs": 2}, optim={"lr": 1e-3, "micro_batch_size": 4})
    )
    local = Trainer(config)
    batch = served_batch(local, rows(local.tokenizer))
    expected = local.step(batch)
    verl = VerlTrainer(config.model_copy(update={"backend": "verl"}))
    try:
        assert verl.ref is None and not verl.single_epoch  # no reference group; compute_log_prob's path
        got = verl.step(batch)
    finally:
        verl.close()
    for name in ("loss", "pg_loss", "grad_norm", "lr", "mismatch", "is_weight_mean"):
        assert got[name] == pytest.approx(expected[name], abs=TOLERANCE), name


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ({"trainer": {"nodes": 2}}, "verl.trainer.nodes: verl's ppo_trainer.yaml has no such key"),
        (
            {"actor_rollout_ref": {"actor": {"optim": {"lr": 0.1}}}},
            "verl.actor_rollout_ref.actor.optim.lr: otel-rl sets it",
        ),
        ({"trainer": {"nnodes": "two"}}, "verl.trainer.nnodes: expected int"),
        ({"actor_rollout_ref": {"actor": {"fsdp_config": []}}}, "verl.actor_rollout_ref.actor.fsdp_config:"),
        ({"actor_rollout_ref": {"actor": {"ppo_micro_batch_size": 4}}}, "verl.actor_rollout_ref.actor:"),
    ],
)
def test_a_bad_verl_key_is_named_before_anything_starts(tiny_model_dir, section, named):
    with pytest.raises(ConfigError, match="^config: " + named.replace(".", r"\.")):
        config_from_dict(settings(tiny_model_dir, backend="verl", verl=section))


def test_verls_own_keys_pass_through(tiny_model_dir):
    config = config_from_dict(
        settings(
            tiny_model_dir,
            backend="verl",
            verl={"actor_rollout_ref": {"actor": {"fsdp_config": {"param_offload": True}}}},
        )
    )
    check_overrides(config.verl_settings(), config.verl)  # no error: a key otel-rl has no setting for
    from otel_rl.train.verl.config import compose_config

    composed = compose_config(config.verl_settings(), config.verl)
    assert composed.actor_rollout_ref.actor.fsdp_config.param_offload is True
    assert composed.actor_rollout_ref.actor.optim.lr == 1e-3  # from otel-rl's own setting
    assert composed.actor_rollout_ref.actor.strategy == "fsdp2"
