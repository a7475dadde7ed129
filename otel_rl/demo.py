"""`otel-rl demo`: a tiny model learns a tool-using calculator task on a laptop, through the pipeline."""

import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.console import Console

from otel_rl.demo_report import SQL_TO_TRY, markdown_report, plot_rewards
from otel_rl.demo_server import running_server

if TYPE_CHECKING:
    from otel_rl.train.config import TrainConfig


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
WORKDIR = Path(".otel_rl") / "demo"


@dataclass(frozen=True)
class DemoPlan:
    """How much of everything the demo does (tiny-rl-notes.md has the measurements behind the full plan)."""

    expert_rollouts: int  # stage 1: transcripts of the scripted expert
    sft_steps: int
    sft_lr: float
    rl_steps: int  # stage 2: online GRPO updates
    group_size: int
    groups_per_step: int
    rl_lr: float
    val_tasks: int  # held-out problems evaluated before and after RL
    concurrency: int  # harness processes at a time


# Measured (docs/training.md, "What to expect"): 2,000 expert transcripts and 800 SFT steps give ≈37% greedy
# held-out success (digit copying appears only after ~500 steps); 20 GRPO steps of 8 groups × 8 rollouts at
# lr 2e-4 then gave 68-72% greedy, 60-68% sampled; 8.5-9.5 minutes in all on 2 cores.
FULL = DemoPlan(
    expert_rollouts=2000,
    sft_steps=800,
    sft_lr=2e-3,
    rl_steps=20,
    group_size=8,
    groups_per_step=8,
    rl_lr=2e-4,
    val_tasks=200,
    concurrency=16,
)
QUICK = DemoPlan(
    expert_rollouts=200,
    sft_steps=30,
    sft_lr=2e-3,
    rl_steps=2,
    group_size=4,
    groups_per_step=2,
    rl_lr=1e-4,
    val_tasks=8,
    concurrency=4,
)


def _calc_task() -> ModuleType:
    """examples/calc_task.py: the task lives with the example harnesses, outside the package."""
    spec = importlib.util.spec_from_file_location("calc_task", EXAMPLES / "calc_task.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_task_files(workdir: Path, plan: DemoPlan, seed: int = 0) -> dict[str, Path]:
    """Expert, train and held-out (val) tasks; no held-out (a, op, b) appears in the other two. The split
    and the held-out tasks are the same for every `seed` (evaluations stay comparable); `seed` draws the
    expert's and the training tasks."""
    task = _calc_task()
    train, _ = task.split_problems(seed=0)
    expert_tasks = task.sample_tasks(train, plan.expert_rollouts, "train", 1 + 2 * seed)
    return {
        "expert": task.write_tasks(workdir / "expert.jsonl", expert_tasks),
        "train": task.write_tasks(
            workdir / "train.jsonl", task.sample_tasks(train, 2000, "train", 2 + 2 * seed)
        ),
        "val": task.write_tasks(workdir / "val.jsonl", task.heldout_tasks(seed=0)[: plan.val_tasks]),
    }


def run_expert(url: str, token: str, tasks: Path, workdir: Path, console: Console) -> dict[str, Any]:
    """Stage 1's harness: the scripted expert answers every expert task; its traces go to the server."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_RL_TOKEN": token, "OTEL_SERVICE_NAME": "expert_agent"}
    with console.status(f"the scripted expert harness runs {sum(1 for _ in tasks.open())} rollouts"):
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / "expert_agent.py"), "--tasks", str(tasks)],
            env=env, capture_output=True, text=True, cwd=workdir,
        )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the expert harness failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _base_config(url: str, token: str, seed: int) -> dict[str, Any]:
    return {
        "server": {"url": url, "token": token},
        # The calculator harness grades its own answer with a script (examples/calc_task.check); the model
        # only writes text and cannot reach that code, so the harness's rewards are trusted here.
        "reward": {"trusted_sources": ["harness"]},
        "seed": seed,
    }


def sft_settings(
    plan: DemoPlan, url: str, token: str, model: Path, workdir: Path, seed: int = 0
) -> "TrainConfig":
    """Stage 1: behaviour cloning of every expert transcript (no reward filter: the noise is the point)."""
    from otel_rl.train.config import config_from_dict

    return config_from_dict(
        _base_config(url, token, seed)
        | {
            "model": str(model),
            "output_dir": str(workdir / "sft"),
            "steps": plan.sft_steps,
            "save_every": plan.sft_steps,
            # SFT has the cores to itself (vLLM idles meanwhile): two threads took 170 ms a step, one 280 ms;
            # more threads than cores were 10x slower
            "torch_threads": min(2, os.cpu_count() or 1),
            "optim": {"lr": plan.sft_lr, "warmup_steps": min(20, plan.sft_steps // 10), "schedule": "cosine"},
            "offline": {"where": "service_name = 'expert_agent'"},
        }
    )


def rl_settings(
    plan: DemoPlan,
    url: str,
    token: str,
    model: Path,
    workdir: Path,
    tasks: dict[str, Path],
    backend: str = "local",
    seed: int = 0,
    world_size: int = 1,
) -> "TrainConfig":
    """Stage 2: online GRPO with the calculator harness, held-out evaluation with the same harness."""
    from otel_rl.train.config import config_from_dict

    harness = [sys.executable, str(EXAMPLES / "calc_agent.py")]  # samples at temperature 1
    return config_from_dict(
        _base_config(url, token, seed)
        | {
            "model": str(model),
            "output_dir": str(workdir / "rl"),
            "backend": backend,
            "world_size": world_size,
            "steps": plan.rl_steps,
            "optim": {"lr": plan.rl_lr, "micro_batch_size": 64},
            "algorithm": {"group_size": plan.group_size, "groups_per_step": plan.groups_per_step},
            "online": {
                "tasks": str(tasks["train"]),
                "harness": harness,
                # each rollout forks from a process that imported these: no interpreter start-up per rollout
                "preload": ["openai", "otel_rl"],
                # harnesses run while the trainer trains (asynchronous RL): on 2 cores, let it go first
                "nice": 10,
                "concurrency": plan.concurrency,
                "timeout_s": 120,
            },
            # greedy: the policy's most likely behaviour, the least noisy measure of what it learned;
            # sampled (temperature 1): what the rollouts the policy trains on achieve
            "eval": {
                "tasks": str(tasks["val"]),
                "harnesses": {"greedy": [*harness, "--temperature", "0"], "sampled": harness},
            },
        }
    )


def run_demo(
    plan: DemoPlan,
    workdir: Path,
    console: Console,
    vllm_url: str | None = None,
    backend: str = "local",
    seed: int = 0,
    world_size: int = 1,
    colocated: bool = False,
) -> dict[str, Any]:
    """Both stages end to end; returns the report (also written to workdir/report.json). `backend` trains
    stage 2 (local or verl); stage 1's SFT is the local trainer's (verl's backend trains RL updates only).

    With `vllm_url`, the gateway uses that running vLLM server (it must serve a model of the tiny model's
    shape, with the reload endpoints on) instead of starting one; it is left serving the trained weights.
    `world_size`: verl's ranks for stage 2 (backend verl), checked against the machine before anything starts.
    `colocated`: the server runs `serve --colocated`: vLLM sleeps during each online update.
    """
    from otel_rl.tinymodel import init_model
    from otel_rl.train.offline import sft_from_traces
    from otel_rl.train.online import run_online

    if not (EXAMPLES / "calc_agent.py").is_file():
        raise RuntimeError(
            f"the demo runs the example harnesses of {EXAMPLES}: run it from a checkout of otel-rl"
        )
    check_demo_world_size(world_size, backend)
    started = time.monotonic()
    timings: dict[str, float] = {}
    # Every child process (server, harnesses, trainer) runs with paths of its own: absolute ones, so that
    # a harness started in the working folder finds its task file whatever the demo's own directory.
    workdir = workdir.resolve()
    shutil.rmtree(workdir, ignore_errors=True)  # a fresh demo every time
    workdir.mkdir(parents=True)
    token = secrets.token_urlsafe(24)

    console.rule("[bold]otel-rl demo: a 1M-parameter model learns to use a calculator")
    with console.status("building the tiny model and its tokenizer"):
        initial = init_model(workdir / "model-init", seed=seed)
        tasks = write_task_files(workdir, plan, seed)
    with running_server(workdir, initial, vllm_url, token, console, colocated) as url:
        timings["setup_s"] = time.monotonic() - started
        console.print(f"server and gateway at {url} (vLLM behind it); store {workdir / 'otel_rl.duckdb'}")

        console.rule("stage 1, offline: a scripted expert harness produces traces; SFT from them")
        stage = time.monotonic()
        expert = run_expert(url, token, tasks["expert"], workdir, console)
        console.print(
            f"expert: {expert['rollouts']} rollouts, success {expert['mean_reward']:.1%} (noisy on purpose)"
        )
        sft_config = sft_settings(plan, url, token, initial, workdir, seed)
        start_policy = sft_from_traces(sft_config, console)
        timings["stage1_s"] = time.monotonic() - stage

        console.rule("stage 2, online: GRPO through the gateway, the store and synchronized reloads")
        stage = time.monotonic()
        rl_config = rl_settings(plan, url, token, start_policy, workdir, tasks, backend, seed, world_size)
        result = run_online(rl_config, console)
        timings["stage2_s"] = time.monotonic() - stage

    greedy = [record for record in result.evals if record.name == "greedy"]
    sampled = [record for record in result.evals if record.name == "sampled"]
    report = {
        "success_before": greedy[0].success_rate,
        "success_after": greedy[-1].success_rate,
        "sampled_success_before": sampled[0].success_rate,
        "sampled_success_after": sampled[-1].success_rate,
        "steps": len(result.steps),
        "seed": seed,
        "backend": backend,
        "world_size": world_size,  # verl's data-parallel ranks in stage 2 (1: the local backend)
        "colocated": colocated,  # each train step's colocated_pause_s: how long calls were held
        "wall_seconds": time.monotonic() - started,
        "timings": timings,
        "expert": expert,
        "plan": asdict(plan),
        "train_steps": [asdict(step) | {"group_ids": len(step.group_ids)} for step in result.steps],
        "evals": [asdict(record) for record in result.evals],
        "store": str(workdir / "otel_rl.duckdb"),
        "final_checkpoint": str(rl_config.output_dir / f"step-{len(result.steps)}"),
    }
    (workdir / "report.json").write_text(json.dumps(report, indent=2))
    plot_rewards(report, workdir / "reward_curve.png")
    (workdir / "report.md").write_text(markdown_report(report))
    return report


def check_demo_world_size(world_size: int, backend: str) -> None:
    """Raise ValueError naming --world-size when stage 2 cannot run that many ranks here."""
    from otel_rl.train.verl.world import check_world_size

    if world_size > 1 and backend != "verl":
        raise ValueError(f"--world-size {world_size}: several ranks need --backend verl")
    try:
        check_world_size(world_size, 1, "cpu")
    except ValueError as error:
        raise ValueError(str(error).replace("world_size:", "--world-size:", 1)) from None


def demo_command(
    quick: Annotated[
        bool, typer.Option(help="A shortened run (a few minutes) that checks every stage")
    ] = False,
    workdir: Annotated[
        Path, typer.Option(help="Where the model, store, checkpoints and report go")
    ] = WORKDIR,
    vllm: Annotated[
        str | None,
        typer.Option(help="Use this running vLLM server (tiny model, reloads on); default: start one"),
    ] = None,
    backend: Annotated[
        Literal["local", "verl"],
        typer.Option(help="Who trains stage 2: otel-rl's own trainer, or verl's engine (docs/verl.md)"),
    ] = "local",
    seed: Annotated[
        int, typer.Option(help="Seeds the tiny model, the expert's and training tasks, and training")
    ] = 0,
    world_size: Annotated[
        int, typer.Option(min=1, help="verl's data-parallel ranks for stage 2 (--backend verl; one a core)")
    ] = 1,
    colocated: Annotated[
        bool, typer.Option(help="serve --colocated: vLLM sleeps while the trainer updates (docs/gateway.md)")
    ] = False,
    serve: Annotated[
        bool, typer.Option(help="At the end, serve the web view of the run (/ui) until Ctrl-C")
    ] = True,
) -> None:
    """Build a tiny model, start vLLM and the server, fine-tune it on a scripted expert's traces, then
    improve it with online GRPO through the real harness; report held-out success before and after."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    # SIGTERM unwinds like Ctrl-C, so the server and vLLM this demo started are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    console = Console()
    workdir = workdir.resolve()
    try:
        plan = QUICK if quick else FULL
        report = run_demo(plan, workdir, console, vllm, backend, seed, world_size, colocated)
    except (RuntimeError, ValueError) as error:
        console.print(f"[red]demo failed:[/] {error}")
        raise typer.Exit(1) from None
    console.rule("[bold]result")
    for name, before, after in (
        ("greedy", report["success_before"], report["success_after"]),
        ("sampled", report["sampled_success_before"], report["sampled_success_after"]),
    ):
        console.print(
            f"held-out {name} success: [bold]{before:.1%} → {after:.1%}[/] ({after - before:+.1%}) "
            f"after {report['steps']} RL steps"
        )
    console.print(f"whole demo {report['wall_seconds']:.0f} s")
    console.print(
        f"report: {workdir / 'report.md'}, {workdir / 'report.json'}, {workdir / 'reward_curve.png'}"
    )
    console.print("look inside:")
    for title, sql in SQL_TO_TRY:
        console.print(f'  [dim]# {title}[/]\n  otel-rl sql --db {report["store"]} "{sql}"', soft_wrap=True)
    if serve:
        from otel_rl.server import serve_until_interrupted

        serve_until_interrupted(Path(report["store"]), tokenizer=workdir / "model-init", console=console)
