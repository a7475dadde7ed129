"""The two training backends on the same batches: step time and trainer tokens/s of the local trainer and of
verl's workers (FSDP2 on a CPU Ray worker group), beside the floor, a plain transformers forward+backward
of the same micro-batches; and the share of a verl step the batch pipeline takes (samples -> DataProto ->
verl's no-padding TensorDict). Called by bench/train.py --backend verl; runs alone with

    .venv/bin/python bench/train_backends.py [--steps 5 --groups 4 --group-size 4]
"""

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

from calc_task import sample_tasks, split_problems  # noqa: E402

from otel_rl.tinymodel import init_model  # noqa: E402
from otel_rl.train.config import TrainConfig, config_from_dict  # noqa: E402
from otel_rl.train.trainer import Trainer  # noqa: E402
from otel_rl.transforms.advantages import rollout_advantages  # noqa: E402
from otel_rl.transforms.export import to_dataproto  # noqa: E402

SPEED_AIM = 1.5  # verl's step time within 1.5x of the local backend's
PIPELINE_AIM = 0.05


def samples(tokenizer, groups: int, group_size: int, seed: int) -> pl.DataFrame:
    """Calculator prompts with 20-60-token responses, in GRPO groups, as otel_rl.transforms makes them."""
    rng = random.Random(seed)
    tasks = sample_tasks(split_problems(0)[0], groups, "train", seed=seed)
    rows = []
    for g, task in enumerate(tasks):
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": task["question"]}], add_generation_prompt=True
        )["input_ids"]
        for i in range(group_size):
            response = [rng.randrange(3, tokenizer.vocab_size) for _ in range(rng.randint(20, 60))]
            rows.append(
                {
                    "segment_id": f"s{g}-{i}",
                    "rollout_id": f"r{g}-{i}",
                    "group_id": f"g{g}",
                    "prompt_ids": prompt,
                    "response_ids": response,
                    "response_mask": [1] * len(response),
                    "reward": float(rng.random() < 0.5),
                    "loss_weight": 1.0,
                    "rollout_logprobs": [-rng.uniform(0.5, 3.0) for _ in response],
                    "has_logprobs": True,
                }
            )
    frame = pl.DataFrame(rows)
    advantages = rollout_advantages(frame.select("rollout_id", "group_id", "reward"), "grpo")
    return frame.join(advantages.select("rollout_id", "advantage"), on="rollout_id")


def floor_step(trainer: Trainer, batch) -> float:
    """Seconds of one plain transformers forward+backward over the batch's micro-batches (no loss terms,
    no optimizer): what any trainer must spend on this batch."""
    tensors = {key: batch.batch[key] for key in ("input_ids", "attention_mask", "position_ids", "responses")}
    size = trainer.config.optim.micro_batch_size
    started = time.perf_counter()
    for start in range(0, len(batch), size):
        mb = {key: value[start : start + size] for key, value in tensors.items()}
        trainer.response_logprobs(trainer.model, mb).sum().backward()
    trainer.model.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def timed(step, batches: list) -> list[float]:
    times = []
    for batch in batches:
        started = time.perf_counter()
        step(batch)
        times.append(time.perf_counter() - started)
    return times


def compare(console: Console, config: TrainConfig, frames: list[pl.DataFrame]) -> dict[str, float]:
    """Median step seconds of floor, local and verl on the same batches (the first of each is a warm-up)."""
    from otel_rl.train.verl import VerlTrainer
    from otel_rl.train.verl.trainer import to_worker_input

    local = Trainer(config)
    pad = local.tokenizer.pad_token_id
    batches = [to_dataproto(frame, pad) for frame in frames]
    figures = {"floor": statistics.median(floor_step(local, b) for b in batches[1:])}
    figures["local"] = statistics.median(timed(local.step, batches)[1:])

    pipeline = []
    for frame in frames:
        started = time.perf_counter()
        to_worker_input(to_dataproto(frame, pad))
        pipeline.append(time.perf_counter() - started)
    started = time.perf_counter()
    verl = VerlTrainer(config.model_copy(update={"backend": "verl"}))
    startup = time.perf_counter() - started
    try:
        figures["verl"] = statistics.median(timed(verl.step, batches)[1:])
    finally:
        verl.close()

    tokens = statistics.mean(b.batch["attention_mask"].sum().item() for b in batches)
    table = Table(title=f"trainer on the same batches: {len(batches[0])} samples, ~{tokens:.0f} tokens, CPU")
    for column in ("", "step s (median)", "tokens/s", "vs floor"):
        table.add_column(column, justify="right")
    for name, seconds in figures.items():
        table.add_row(name, f"{seconds:.3f}", f"{tokens / seconds:.0f}", f"{seconds / figures['floor']:.2f}x")
    console.print(table)
    ratio = figures["verl"] / figures["local"]
    console.print(
        f"verl / local step time: {ratio:.2f}x ({'within' if ratio <= SPEED_AIM else 'OVER'} the "
        f"{SPEED_AIM}x aim); verl's start-up (Ray, workers, model load): {startup:.1f} s, once a run"
    )
    pipeline_s = statistics.median(pipeline)
    share = pipeline_s / figures["verl"]
    verdict = "within" if share < PIPELINE_AIM else "OVER"
    console.print(
        "pipeline (samples -> DataProto -> verl's no-padding TensorDict): "
        f"{pipeline_s * 1e3:.1f} ms = {share:.1%} of a verl step ({verdict} the {PIPELINE_AIM:.0%} aim)"
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=5, help="measured steps of each (after one warm-up)")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-backends-") as tmp:
        model = init_model(Path(tmp) / "tiny")
        config = config_from_dict(
            {
                "model": str(model),
                "steps": args.steps + 1,
                "optim": {"lr": 1e-4, "micro_batch_size": args.micro_batch_size},
                "algorithm": {"group_size": args.group_size, "groups_per_step": args.groups},
            }
        )
        tokenizer = AutoTokenizer.from_pretrained(model)
        frames = [samples(tokenizer, args.groups, args.group_size, seed) for seed in range(args.steps + 1)]
        compare(Console(), config, frames)


if __name__ == "__main__":
    main()
