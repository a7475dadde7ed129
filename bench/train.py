"""Online training bench: per-step wall time split (collect / transform / train / save / reload), the share
of wall time the harnesses were paused for reloads (aim: under 5%), and the trainer's samples/s.

Runs the real pipeline: the tiny model in vLLM, `otel-rl serve` with the gateway in front of it, the
calculator harness (examples/calc_agent.py) as processes under the rollout controller, the trainer of
`--backend`. With `--backend verl` it first compares both backends on the same fixed batches (step time,
trainer tokens/s, the floor of a plain forward+backward: bench/train_backends.py), then trains online on verl.

    .venv/bin/python bench/train.py [--backend verl --steps 6 --group-size 4 --groups 4 --max-staleness 1]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "bench"))

from calc_task import sample_tasks, split_problems, write_tasks  # noqa: E402
from train_backends import compare, samples  # noqa: E402

from otel_rl.controller import Controller, ControllerSettings, group_rollouts  # noqa: E402
from otel_rl.gateway.vllm import VLLMServer, free_ports  # noqa: E402
from otel_rl.tinymodel import init_model  # noqa: E402
from otel_rl.train.config import config_from_dict  # noqa: E402
from otel_rl.train.online import run_online  # noqa: E402
from otel_rl.train.server_client import ServerClient  # noqa: E402

PAUSE_AIM = 0.05
TOKEN = "bench-admin-token"


def start_server(workdir: Path, vllm_url: str) -> tuple[subprocess.Popen, str]:
    """`otel-rl serve` with the gateway in front of one vLLM server; returns it once healthy."""
    port, grpc_port = free_ports(2)
    args = [str(Path(sys.executable).parent / "otel-rl"), "serve", "--db", str(workdir / "bench.duckdb")]
    args += ["--token", TOKEN, "--http-port", str(port), "--grpc-port", str(grpc_port), "--vllm", vllm_url]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    log = (workdir / "server.log").open("wb")
    server = subprocess.Popen(args, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"otel-rl serve exited: see {workdir / 'server.log'}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return server, url
        except httpx.TransportError:
            time.sleep(0.2)
    server.kill()
    raise TimeoutError("otel-rl serve did not become healthy in 60 s")


def controller_overhead(console: Console, url: str, log_dir: Path, n: int) -> None:
    """n rollouts of `sleep 2` at once: all in flight together if the controller scales (wall ≈ 2 s)."""
    client = ServerClient(url, TOKEN)
    settings = ControllerSettings(command=["sleep", "2"], concurrency=n, timeout_s=120, log_dir=log_dir)
    controller = Controller(
        settings,
        otlp_endpoint=url,
        openai_base_url=f"{url}/v1",
        token=TOKEN,
        issue_key=client.issue_rollout_key,
    )
    started = time.perf_counter()
    results = controller.run(group_rollouts("sleep", {}, n))
    wall = time.perf_counter() - started
    controller.close()
    statuses = Counter(result.status.value for result in results)
    console.print(
        f"controller: {n} rollouts of `sleep 2` with concurrency {n}: {wall:.1f} s wall "
        f"(vs 2 s if all run at once, {2 * n:.0f} s one at a time); statuses {dict(statuses)}"
    )


def harness_starts(console: Console, url: str, log_dir: Path, tasks: list[dict], concurrency: int) -> None:
    """The calculator agent on the same tasks as fresh processes and forked from a preloading fork server:
    wall time and CPU seconds of the harness processes per rollout (children's CPU, this process's
    excluded; a fork server's children are counted when it exits, at the end of `run`)."""
    client = ServerClient(url, TOKEN)
    harness = [sys.executable, str(ROOT / "examples" / "calc_agent.py")]
    figures = {}
    for mode, preload in (("fresh processes", ()), ("forked (preload)", ("openai", "otel_rl"))):
        settings = ControllerSettings(
            command=harness, concurrency=concurrency, timeout_s=120, log_dir=log_dir, preload=preload
        )
        controller = Controller(
            settings, otlp_endpoint=url, openai_base_url=f"{url}/v1", token=TOKEN,
            issue_key=client.issue_rollout_key,
        )  # fmt: skip
        rollouts = [r for task in tasks for r in group_rollouts(task["id"], task, 1)]
        before, started = os.times(), time.perf_counter()
        results = controller.run(rollouts)
        wall, after = time.perf_counter() - started, os.times()
        controller.close()
        cpu = (after.children_user + after.children_system) - (before.children_user + before.children_system)
        figures[mode] = (wall / len(rollouts), cpu / len(rollouts))
        statuses = dict(Counter(result.status.value for result in results))
        console.print(
            f"{mode}: {len(rollouts)} calculator rollouts, {wall:.1f} s wall, "
            f"{cpu / len(rollouts):.2f} harness CPU-s a rollout; statuses {statuses}"
        )
    (fresh_wall, fresh_cpu), (forked_wall, forked_cpu) = figures.values()
    console.print(
        f"forked vs fresh: {fresh_cpu / forked_cpu:.1f}x less harness CPU a rollout, "
        f"{fresh_wall / forked_wall:.1f}x the rollouts per second"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=("local", "verl"), default="local")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--groups", type=int, default=4, help="groups per step")
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--in-flight", type=int, default=200, help="rollouts at once in the controller check")
    parser.add_argument("--start-rollouts", type=int, default=48, help="rollouts in the harness start check")
    args = parser.parse_args()
    console = Console()

    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-train-") as tmp:
        workdir = Path(tmp)
        model = init_model(workdir / "tiny")
        if args.backend == "verl":
            compare_backends(console, model, args)
        train_problems, _ = split_problems()
        tasks = write_tasks(workdir / "tasks.jsonl", sample_tasks(train_problems, 200, "train", seed=0))
        with VLLMServer(model, served_model_name="tiny", log_path=workdir / "vllm.log") as vllm:
            server, url = start_server(workdir, vllm.url)
            try:
                controller_overhead(console, url, workdir / "sleep", args.in_flight)
                starts = [json.loads(line) for line in tasks.read_text().splitlines()[: args.start_rollouts]]
                harness_starts(console, url, workdir / "starts", starts, args.concurrency)
                config = config_from_dict(
                    {
                        "model": str(model),
                        "output_dir": str(workdir / "run"),
                        "steps": args.steps,
                        "backend": args.backend,
                        "server": {"url": url, "token": TOKEN},
                        "algorithm": {
                            "group_size": args.group_size,
                            "groups_per_step": args.groups,
                            "max_staleness": args.max_staleness,
                        },
                        "reward": {"trusted_sources": ["harness"]},  # the calculator agent grades itself
                        "online": {
                            "tasks": str(tasks),
                            "harness": [sys.executable, str(ROOT / "examples" / "calc_agent.py")],
                            "preload": ["openai", "otel_rl"],
                            "concurrency": args.concurrency,
                            "timeout_s": 120,
                        },
                    }
                )
                result = run_online(config, console)
            finally:
                server.terminate()
                server.wait(30)
    report(console, result.steps, result.wall_s, args)


def compare_backends(console: Console, model: Path, args: argparse.Namespace) -> None:
    """Both backends and the floor on the same batches of the online run's shape (no vLLM needed)."""
    from transformers import AutoTokenizer

    config = config_from_dict({"model": str(model), "steps": 6, "algorithm": {"group_size": args.group_size}})
    tokenizer = AutoTokenizer.from_pretrained(model)
    compare(console, config, [samples(tokenizer, args.groups, args.group_size, seed) for seed in range(6)])


def report(console: Console, steps: list, wall_s: float, args: argparse.Namespace) -> None:
    table = Table(title=f"online steps: {args.groups} groups × {args.group_size} rollouts, tiny model, CPU")
    for column in (
        "step",
        "samples",
        "collect s",
        "transform s",
        "train s",
        "save s",
        "reload s",
        "paused s",
        "wall s",
    ):
        table.add_column(column, justify="right")
    for s in steps:
        table.add_row(
            str(s.step),
            str(s.samples),
            *(
                f"{v:.2f}"
                for v in (s.collect_s, s.transform_s, s.train_s, s.save_s, s.reload_s, s.paused_s, s.wall_s)
            ),
        )
    console.print(table)

    # The first step also waits for the first groups to start from nothing: report steady state separately.
    steady = steps[1:] or steps
    step_wall = sum(s.wall_s for s in steady)
    phases = {
        name: sum(getattr(s, f"{name}_s") for s in steady)
        for name in ("collect", "transform", "train", "save", "reload")
    }
    console.print(
        "share of step wall time (steps 2+): "
        + ", ".join(f"{k} {v / step_wall:.1%}" for k, v in phases.items())
    )
    paused = sum(s.paused_s for s in steps)
    total_steps_wall = sum(s.wall_s for s in steps)
    pause_share = paused / total_steps_wall
    verdict = "within" if pause_share < PAUSE_AIM else "OVER"
    drained = sum(s.drain_s for s in steps)
    console.print(
        f"harnesses paused for reloads: {paused:.2f} s of {total_steps_wall:.1f} s = {pause_share:.2%} "
        f"({verdict} the {PAUSE_AIM:.0%} aim); of which {drained:.2f} s waiting for calls in flight to end, "
        f"{paused - drained:.2f} s swapping weights ({(paused - drained) / total_steps_wall:.2%})"
    )
    samples = sum(s.samples for s in steady)
    train_s = sum(s.train_s for s in steady)
    trainer_rate, loop_rate = samples / train_s, samples / step_wall
    console.print(
        f"trainer: {trainer_rate:.1f} samples/s, {sum(s.response_tokens for s in steady) / train_s:.0f} "
        f"response tokens/s on the tiny model; the whole loop: {loop_rate:.1f} samples/s "
        f"(the trainer alone is {trainer_rate / loop_rate:.1f}x faster than the loop it is part of)"
    )
    console.print(
        f"whole run (incl. trainer load and the first reload): {wall_s:.1f} s for {len(steps)} steps"
    )


if __name__ == "__main__":
    main()
