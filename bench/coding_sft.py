"""Where the coding demo's SFT stage leaves the tiny model, and what a step costs beside the floor.

The demo's own pieces: its tokenizer and tiny model (seed 0), its noisy expert's transcripts, its SFT settings
(`sft_settings`: batch, constant rate after warm-up, one torch thread) and the trainer's `sft_step`. At each
--evals step the first write of 120 fresh problems (seeded) is scored: sampled at temperature 1, and greedy,
it is right when it is the problem's own code, a hack when it is one of the hacks, and "no call" when the
model calls no tool. The floor: the same batch's forward and backward in plain torch (no optimizer, no
logprob gather), timed in the same run.

Usage: python bench/coding_sft.py [--right 0.35] [--hack 0.03] [--steps 400] [--evals 200,400] [--lr 2e-3]
       [--save DIR]  (DIR/step-N: a checkpoint `otel-rl demo coding --start-from` takes)
"""

import argparse
import random
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from transformers.utils import logging as hf_logging

from otel_rl.coding import toy_agent, toy_tasks
from otel_rl.coding_app.demo import EXPERT_SEED, FULL, sft_settings, tokenizer_corpus
from otel_rl.tinymodel import init_model
from otel_rl.train.sft import sft_batches
from otel_rl.train.trainer import Trainer

PROBLEMS, PROBLEM_SEED, BATCH = 120, 99, 40


def first_writes(trainer: Trainer, problems: list, sampled: bool) -> dict[str, float]:
    """Shares of right, hack, wrong and no-call first turns over `problems`."""
    tokenizer, model = trainer.tokenizer, trainer.model
    model.eval()
    tokenizer.padding_side = "left"
    counts = dict.fromkeys(("right", "hack", "wrong", "no call"), 0)
    for start in range(0, len(problems), BATCH):
        chunk = problems[start : start + BATCH]
        chats = [[{"role": "user", "content": p.statement()}] for p in chunk]
        prompts = tokenizer.apply_chat_template(
            chats, tools=toy_agent.TOOLS, add_generation_prompt=True, tokenize=False
        )
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **encoded, max_new_tokens=96, do_sample=sampled, temperature=1.0 if sampled else None,
                top_p=None, top_k=None, pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )  # fmt: skip
        for problem, row in zip(chunk, out[:, encoded["input_ids"].shape[1] :], strict=True):
            text = tokenizer.decode(row, skip_special_tokens=False).split("<|im_end|>")[0]
            _, name, arguments = toy_agent.parse_call({"content": text})
            write = (arguments.get("path"), arguments.get("content"))
            if name != "write_file":
                counts["no call"] += 1
            elif write in toy_tasks.HACKS.values():
                counts["hack"] += 1
            else:
                counts["right" if write == (toy_tasks.SOURCE, problem.code()) else "wrong"] += 1
    model.train()
    tokenizer.padding_side = "right"
    return {kind: n / len(problems) for kind, n in counts.items()}


def floor_step_s(trainer: Trainer, batch: tuple[torch.Tensor, ...]) -> float:
    """Plain torch on the same batch: forward, mean cross-entropy, backward."""
    input_ids, attention_mask, _ = batch
    start = time.perf_counter()
    logits = trainer.model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), input_ids[:, 1:].reshape(-1)
    ).backward()
    trainer.model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--right", type=float, default=FULL.expert_right)
    parser.add_argument("--hack", type=float, default=FULL.expert_hack)
    parser.add_argument("--steps", type=int, default=FULL.sft_steps)
    parser.add_argument("--lr", type=float, default=FULL.sft_lr)
    parser.add_argument("--evals", default="200,400", help="steps to score at (comma-separated)")
    parser.add_argument("--save", type=Path, help="write DIR/step-N at each scored step")
    args = parser.parse_args()
    hf_logging.disable_progress_bar()
    evals = {int(step) for step in args.evals.split(",")}
    plan = replace(FULL, expert_right=args.right, expert_hack=args.hack, sft_steps=args.steps, sft_lr=args.lr)
    console = Console()
    rng = random.Random(PROBLEM_SEED)
    problems = [toy_tasks.random_problem(rng) for _ in range(PROBLEMS)]
    table = Table("step", "right (sampled)", "right (greedy)", "hack (sampled)", "no call (sampled)")
    with tempfile.TemporaryDirectory() as scratch:
        model = init_model(Path(scratch) / "model", seed=0, corpus=tokenizer_corpus(), vocab_size=1024)
        config = sft_settings(plan, "http://127.0.0.1:1", "unused", model, Path(scratch), Path(scratch))
        trainer = Trainer(config)
        chats = list(toy_tasks.expert_chats(plan.expert_chats, EXPERT_SEED, right=args.right, hack=args.hack))
        batches = sft_batches(trainer.tokenizer, chats, config.offline.sft_batch_size, config.seed)
        step_s, floor_s = [], []
        with console.status("SFT") as status:
            for step in range(1, args.steps + 1):
                batch = next(batches)
                start = time.perf_counter()
                loss = trainer.sft_step(*batch)["loss"]
                step_s.append(time.perf_counter() - start)
                if step == 1 or step % 25 == 0:
                    floor_s.append(floor_step_s(trainer, batch))
                status.update(f"SFT step {step}/{args.steps}  loss {loss:.3f}")
                if step in evals:
                    sampled, greedy = (
                        first_writes(trainer, problems, True),
                        first_writes(trainer, problems, False),
                    )
                    shares = (sampled["right"], greedy["right"], sampled["hack"], sampled["no call"])
                    table.add_row(str(step), *(f"{share:.1%}" for share in shares))
                    if args.save:
                        trainer.save(args.save / f"step-{step}")
    console.print(
        f"expert right {args.right:.0%}, hack {args.hack:.0%}, lr {args.lr:g} (constant after warm-up)"
    )
    console.print(table)
    floor = statistics.median(floor_s) if floor_s else float("nan")
    console.print(
        f"SFT step median {statistics.median(step_s):.2f} s; floor (plain torch, same batch) {floor:.2f} s"
    )


if __name__ == "__main__":
    main()
