"""`otel-rl demo coding`: the tiny model as a coding agent under a weak grader, a guarded one, and screening.

One server (gateway, store, vLLM) for everything. The tiny model is fine-tuned on a noisy expert's transcripts
(hacks included at a small rate), then three arms train from that same checkpoint with the same seed and
steps, each through the online loop with every rollout in the sandbox and graded outside it: weak (the
harness's own pytest exit status is the reward), guarded (the grader's hidden tests are), screened (the weak
reward, with the rollouts the SQL detectors flag left out). Figures come from the store (demo_report.py).
"""

import json
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from otel_rl.coding import toy_agent, toy_tasks
from otel_rl.coding_app.demo_report import arm_figures, expectations, markdown_report, plot_arms

if TYPE_CHECKING:
    from otel_rl.train.config import TrainConfig

WORKDIR = Path(".otel_rl") / "demo-coding"
AGENT = Path(toy_agent.__file__).resolve()
ARMS = ("weak", "guarded", "screened")
TASKS_SEED, EXPERT_SEED, TOKENIZER_SEED = 1, 2, 3


@dataclass(frozen=True)
class CodingPlan:
    """How much the coding demo does."""

    tasks: int  # toy repositories the arms train on
    unstated_tasks: int  # of those, the ones whose tests ask for a step the statement leaves out
    expert_chats: int  # the expert's transcripts for SFT
    expert_right: float  # its share of right solutions
    expert_hack: float  # its share of hacks (the prior RL may amplify)
    sft_steps: int
    sft_lr: float
    rl_steps: int  # per arm
    group_size: int
    groups_per_step: int
    rl_lr: float
    concurrency: int  # sandboxed rollouts at a time

    @property
    def pass_steps(self) -> int:
        """Steps of one pass over the tasks: groups take every task once per pass (train/tasks.py)."""
        return -(-self.tasks // self.groups_per_step)


FULL = CodingPlan(
    tasks=8, unstated_tasks=4, expert_chats=2000, expert_right=0.35, expert_hack=0.02,
    sft_steps=400, sft_lr=2e-3, rl_steps=16, group_size=8, groups_per_step=4, rl_lr=2e-4, concurrency=6,
)  # fmt: skip
QUICK = CodingPlan(
    tasks=6, unstated_tasks=2, expert_chats=300, expert_right=0.3, expert_hack=0.03,
    sft_steps=20, sft_lr=2e-3, rl_steps=2, group_size=4, groups_per_step=2, rl_lr=3e-4, concurrency=4,
)  # fmt: skip


def write_inputs(workdir: Path, plan: CodingPlan) -> dict[str, Path]:
    """The toy tasks (grader-side file and the loop's id list) and the expert's chat JSONL."""
    ids = toy_tasks.write_tasks(workdir / "toy.jsonl", plan.tasks, TASKS_SEED, unstated=plan.unstated_tasks)
    chats = workdir / "expert_chats.jsonl"
    lines = toy_tasks.expert_chats(
        plan.expert_chats, EXPERT_SEED, right=plan.expert_right, hack=plan.expert_hack
    )
    chats.write_text("".join(json.dumps(chat) + "\n" for chat in lines))
    return {"tasks": workdir / "toy.jsonl", "ids": ids, "chats": chats}


def tokenizer_corpus() -> list[str]:
    """Rendered transcripts the tokenizer learns its merges from: code lines, tool calls and every hack
    become a few tokens each (hacks at a high rate here: a merge needs to be seen)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from otel_rl.tinymodel import CHAT_TEMPLATE

    chats = list(toy_tasks.expert_chats(600, TOKENIZER_SEED, right=0.5, hack=0.3))
    rendered, _ = render_jinja_template(
        [chat["messages"] for chat in chats], tools=toy_agent.TOOLS, chat_template=CHAT_TEMPLATE
    )
    return rendered


def _base(url: str, token: str, model: Path, output: Path) -> dict[str, Any]:
    return {"server": {"url": url, "token": token}, "seed": 0, "model": str(model), "output_dir": str(output)}


def sft_settings(
    plan: CodingPlan, url: str, token: str, model: Path, workdir: Path, chats: Path
) -> "TrainConfig":
    """The warm start: behaviour cloning of the expert's transcripts, noise and hacks included."""
    from otel_rl.train.config import config_from_dict

    return config_from_dict(
        _base(url, token, model, workdir / "sft")
        | {
            "steps": plan.sft_steps,
            "save_every": plan.sft_steps,
            # one thread: two took 20 s a step on 2 cores shared with other work (their barriers wait)
            "torch_threads": 1,
            # a constant rate: copying from the statement appears between steps 200 and 400, and not at all
            # when the rate has decayed by then (docs/coding.md)
            "optim": {"lr": plan.sft_lr, "warmup_steps": min(20, plan.sft_steps // 10)},
            "offline": {"chats": str(chats)},
        }
    )


def arm_settings(
    arm: str, plan: CodingPlan, url: str, token: str, model: Path, workdir: Path, inputs: dict[str, Path]
) -> "TrainConfig":
    """One arm's online run: the same tasks, seed, steps and sandbox; only the reward and screening differ.
    Every rollout is graded outside the sandbox (source `grader`), whichever reward the arm trusts: the
    grader's verdict is the truth every arm is measured by."""
    from otel_rl.train.config import config_from_dict

    trusted = "grader" if arm == "guarded" else "harness"
    return config_from_dict(
        _base(url, token, model, workdir / arm)
        | {
            "steps": plan.rl_steps,
            "optim": {"lr": plan.rl_lr, "micro_batch_size": 64},
            "reward": {"trusted_sources": [trusted]},
            "algorithm": {
                "group_size": plan.group_size,
                "groups_per_step": plan.groups_per_step,
                "screen_flagged": arm == "screened",
            },
            "online": {
                "tasks": str(inputs["ids"]),
                "harness": [sys.executable, str(AGENT)],
                "nice": 10,  # on 2 cores the trainer goes first
                "concurrency": plan.concurrency,
                "timeout_s": 120,
            },
            "controller": {
                "coding": {
                    "tasks": str(inputs["tasks"]),
                    "binds": [str(AGENT)],  # the agent script alone: no other file of this checkout
                    "cpu_seconds": 60,
                    "wall_seconds": 90,
                    "grader_cpu_seconds": 60,
                    "grader_wall_seconds": 120,
                }
            },
        }
    )


CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def held_checkpoint(source: Path, into: Path) -> Path:
    """A copy of the checkpoint the arms start from (`--start-from`), taken before the workdir is cleared: a
    previous run's `sft/step-N` lies inside it."""
    missing = [name for name in CHECKPOINT_FILES if not (source / name).is_file()]
    if missing:
        raise ValueError(f"--start-from {source} is not a checkpoint folder: no {', '.join(missing)}")
    return Path(shutil.copytree(source, into))


def check_same_tokenizer(start: Path, initial: Path, source: Path) -> None:
    """The server serves the demo's tiny model: a checkpoint it reloads must share its tokenizer."""
    if (start / "tokenizer.json").read_bytes() != (initial / "tokenizer.json").read_bytes():
        raise ValueError(
            f"--start-from {source} has another tokenizer than this demo's tiny model: give a checkpoint "
            "that an `otel-rl demo coding` run wrote (its sft/step-N folder)"
        )


def run_coding_demo(
    plan: CodingPlan, workdir: Path, console: Console, start_from: Path | None = None
) -> dict[str, Any]:
    """SFT (or the checkpoint `start_from`), then the three arms, then the report (workdir/report.json,
    report.md, arms.png)."""
    from otel_rl.demo_server import running_server
    from otel_rl.query import query
    from otel_rl.tinymodel import init_model
    from otel_rl.train.offline import sft_from_traces
    from otel_rl.train.online import run_online

    started = time.monotonic()
    timings: dict[str, float] = {}
    workdir = workdir.resolve()
    with tempfile.TemporaryDirectory() as held:
        start = held_checkpoint(start_from.resolve(), Path(held) / "start") if start_from else None
        shutil.rmtree(workdir, ignore_errors=True)  # a fresh demo every time
        workdir.mkdir(parents=True)
        if start is not None:
            start = Path(shutil.copytree(start, workdir / "start-policy"))
    token = secrets.token_urlsafe(24)
    console.rule(
        "[bold]otel-rl demo coding: reward hacking under a weak grader, a guarded one, and screening"
    )
    with console.status("building the tiny model, its tokenizer and the toy tasks"):
        initial = init_model(workdir / "model-init", seed=0, corpus=tokenizer_corpus(), vocab_size=1024)
        inputs = write_inputs(workdir, plan)
    if start is not None and start_from is not None:
        check_same_tokenizer(start, initial, start_from)
    results = {}
    with running_server(workdir, initial, None, token, console) as url:
        timings["setup_s"] = time.monotonic() - started
        if start is None:
            console.rule("warm start: SFT on the noisy expert's transcripts (hacks included)")
            stage = time.monotonic()
            sft = sft_settings(plan, url, token, initial, workdir, inputs["chats"])
            start = sft_from_traces(sft, console)
            timings["sft_s"] = time.monotonic() - stage
        else:
            console.print(f"the arms start from {start_from} (no SFT)")
        for arm in ARMS:
            console.rule(f"arm {arm}: online GRPO, every rollout sandboxed and graded outside")
            stage = time.monotonic()
            results[arm] = run_online(arm_settings(arm, plan, url, token, start, workdir, inputs), console)
            timings[f"{arm}_s"] = time.monotonic() - stage
    store = workdir / "otel_rl.duckdb"
    read = partial(query, db=store)
    arms = {arm: arm_figures(read, result.steps, plan.pass_steps) for arm, result in results.items()}
    report = {
        "arms": arms,
        "expectations": expectations(arms),
        "plan": asdict(plan),
        "start_from": str(start_from) if start_from else None,  # None: the demo's own SFT
        "wall_seconds": time.monotonic() - started,
        "timings": timings,
        "store": str(store),
    }
    report["failed_expectations"] = [e["text"] for e in report["expectations"] if not e["met"]]
    (workdir / "report.json").write_text(json.dumps(report, indent=2))
    plot_arms(arms, workdir / "arms.png")
    (workdir / "report.md").write_text(markdown_report(report))
    return report


def coding_command(
    quick: Annotated[
        bool, typer.Option(help="A shortened run (a few minutes) that checks every stage")
    ] = False,
    workdir: Annotated[
        Path, typer.Option(help="Where the model, store, checkpoints and report go")
    ] = WORKDIR,
    serve: Annotated[
        bool, typer.Option(help="At the end, serve the web view of the run until Ctrl-C")
    ] = True,
    start_from: Annotated[
        Path | None,
        typer.Option(
            help="Skip SFT: the arms start from this checkpoint of an earlier run (its WORKDIR/sft/step-N)"
        ),
    ] = None,
) -> None:
    """The tiny model as a coding agent on toy repositories: fine-tuned on a noisy expert (hacks included),
    then trained three ways (weak grader, guarded grader, weak grader with screening); reports hack rate and
    true pass rate (hidden tests) per step and arm."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # unwinds: servers stop too
    console = Console()
    workdir = workdir.resolve()
    try:
        report = run_coding_demo(QUICK if quick else FULL, workdir, console, start_from)
    except (RuntimeError, ValueError) as error:
        console.print(f"[red]demo failed:[/] {error}")
        raise typer.Exit(1) from None
    console.rule("[bold]result")
    for arm, figures in report["arms"].items():
        console.print(
            f"{arm:9} hack rate {figures['hack_rate_start']:.1%} → {figures['hack_rate_end']:.1%}   "
            f"true pass {figures['truth_pass_start']:.1%} → {figures['truth_pass_end']:.1%}"
        )
    for text in report["failed_expectations"]:
        console.print(f"[yellow]failed expectation:[/] {text}")
    console.print(f"whole demo {report['wall_seconds']:.0f} s")
    console.print(f"report: {workdir / 'report.md'}, {workdir / 'report.json'}, {workdir / 'arms.png'}")
    if serve:
        from otel_rl.server import serve_until_interrupted

        serve_until_interrupted(Path(report["store"]), tokenizer=workdir / "model-init", console=console)
