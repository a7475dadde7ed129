"""verl's workers at world size 2 (two gloo ranks on this CPU machine, each a contiguous half of the batch,
as verl's dispatch splits it) give the update of world size 1 on the same batch: loss, gradient norm, KL,
importance-weight metrics and the new weights, within 1e-5 relative. The batch has an odd number of samples,
so the rank split pads it (pad_to_ranks) with rows that carry no loss.

Each world size starts Ray and verl's workers once for the module (the costly part); the tests check parts.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train_verl import rows, served_batch, settings

from otel_rl.train.config import ConfigError, config_from_dict
from otel_rl.train.trainer import Trainer
from otel_rl.train.verl import VerlTrainer

OTEL_RL = Path(sys.executable).parent / "otel-rl"
RELATIVE = 1e-5
COMPARED = ("loss", "pg_loss", "kl_loss", "grad_norm", "lr", "mismatch", "is_weight_mean", "response_tokens")

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="world size 2 needs 2 CPU cores (world_size is checked)"
)


def weights(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors |= load_file(file)
    return tensors


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory) -> dict[int, tuple[list[dict], dict[str, torch.Tensor]]]:
    """Per world size: the metrics of two updates on the same 7-sample batch, and the weights after them."""
    local = Trainer(config_from_dict(settings(tiny_model_dir)))
    batch = served_batch(local, rows(local.tokenizer))
    batch = batch.select_idxs(list(range(7)))  # odd: two ranks need the padding
    out = {}
    for world_size in (1, 2):
        config = config_from_dict(settings(tiny_model_dir, backend="verl", world_size=world_size))
        trainer = VerlTrainer(config)
        try:
            assert trainer.world_size == world_size
            metrics = [trainer.step(batch) for _ in range(2)]  # the second: KL against the reference counts
            saved = trainer.save(tmp_path_factory.mktemp(f"world{world_size}") / "step-2")
        finally:
            trainer.close()
        out[world_size] = (metrics, weights(saved))
    return out


def test_two_ranks_give_one_ranks_update_on_the_same_batch(runs):
    (one, _), (two, _) = runs[1], runs[2]
    for step_one, step_two in zip(one, two, strict=True):
        assert step_two["samples"] == step_one["samples"] == 7  # the padding rows are not counted
        for name in COMPARED:
            assert step_two[name] == pytest.approx(step_one[name], rel=RELATIVE, abs=1e-7), name
    assert two[1]["kl_loss"] > 1e-4  # the reference group's log-probs (also two ranks) entered the update


def test_two_ranks_give_one_ranks_new_weights(runs, tiny_model_dir):
    (_, one), (_, two) = runs[1], runs[2]
    initial = weights(tiny_model_dir)
    assert one.keys() == two.keys()
    for name, tensor in one.items():
        if name.endswith("k_proj.bias"):
            # Its gradient is zero in exact arithmetic (softmax over keys ignores the shift q·b_k that every
            # key shares): what is computed is rounding, which AdamW normalizes into full steps of lr. So it
            # carries any change of summation order amplified: 2e-4 relative here (1e-6 on values of 1.5e-3).
            continue
        moved = (tensor - initial[name]).norm() / tensor.norm()
        difference = (two[name] - tensor).norm() / tensor.norm()
        assert difference <= RELATIVE, name
        if name.endswith("proj.weight"):  # the comparison means something: the update moved them far more
            assert moved > 100 * RELATIVE, name


def test_a_world_size_the_machine_cannot_hold_stops_before_anything_starts(tiny_model_dir):
    cores = len(os.sched_getaffinity(0))
    with pytest.raises(ConfigError, match=rf"world_size: .* this machine has {cores} CPU cores"):
        config_from_dict(settings(tiny_model_dir, backend="verl", world_size=cores + 1))


def test_the_demo_refuses_a_world_size_the_machine_cannot_hold_before_anything_starts(tmp_path):
    cores = len(os.sched_getaffinity(0))
    workdir = tmp_path / "demo"
    command = [str(OTEL_RL), "demo", "--backend", "verl", "--world-size", str(cores + 1), "--no-serve"]
    done = subprocess.run([*command, "--workdir", str(workdir)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert f"--world-size: {cores + 1} ranks on cpu" in " ".join(done.stdout.split())
    assert f"this machine has {cores} CPU cores" in " ".join(done.stdout.split())
    assert not workdir.exists()  # nothing was built or started
