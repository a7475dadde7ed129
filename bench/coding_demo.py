"""The coding demo's time against its aim (issue 29: the full run within 20 minutes on 2 cores), with the
floor beneath it timed in the same run.

Reads a finished run (`otel-rl demo coding --workdir DIR`): its report's stage times, and from the store's
views (`rollouts`, `llm_calls`) where a rollout's wall time goes: before its first model call (the sandbox
and the agent starting), in its model calls, between them (the agent's tools: `run_tests` is pytest in the
sandbox) and after the last one (the agent's report, the grader's hidden tests in a second sandbox). Then
the floor: what the libraries alone cost for one rollout's work, timed here and now on the run's own toy
repository — bare bwrap twice (the agent's sandbox and the grader's), a Python that imports what the agent
imports, and pytest on the visible tests, once for `run_tests` and once for the grader. The Python and pytest
are timed outside bwrap: the CPU time of what runs inside it does not come back to the caller.
The rollouts' floor is their count times that, over the 2 cores. The SFT stage's floor is
bench/coding_sft.py's (plain torch's forward and backward on the same batch).

Usage: python bench/coding_demo.py DIR [--runs 10]
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from otel_rl.query import query

AIM_S = 20 * 60
CORES = os.cpu_count() or 1
AGENT_IMPORTS = "import httpx, opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter"
# as the agent and the grader run pytest: no plugin autoloaded, no bytecode written into the tree
ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}
SPLIT = """
SELECT r.rollout_id,
       epoch_ms(r.ended_at) - epoch_ms(r.started_at) AS wall_ms,
       epoch_ms(min(c.started_at)) - epoch_ms(r.started_at) AS before_first_ms,
       sum(c.duration_ms) AS calls_ms,
       epoch_ms(max(c.ended_at)) - epoch_ms(min(c.started_at)) - sum(c.duration_ms) AS between_ms,
       epoch_ms(r.ended_at) - epoch_ms(max(c.ended_at)) AS after_last_ms
FROM rollouts r JOIN llm_calls c USING (rollout_id)
GROUP BY r.rollout_id, r.started_at, r.ended_at
"""


def median_cpu_s(command: list[str], cwd: Path, runs: int) -> float:
    """The median CPU time (user + system, the process and all it waited for) of `command`: CPU rather than
    wall time, because the floor is what the 2 cores must do, and a demo running beside would stretch the
    wall time of every command timed here. Each run is checked to have started (exit status 0 or 1)."""
    times = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(command, cwd=cwd, capture_output=True, env={**os.environ, **ENV})
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        times.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if done.returncode not in (0, 1):  # pytest's 1: the unsolved task's tests fail, as they should
            raise SystemExit(f"{command[0]} failed: {done.stderr.decode()[-800:]}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path, help="a finished `otel-rl demo coding` run's --workdir")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    report = json.loads((args.workdir / "report.json").read_text())
    split = query(SPLIT, db=[args.workdir / "otel_rl.duckdb"])
    if split.is_empty():
        raise SystemExit(f"{args.workdir}: no rollout with a model call in its store: not a finished run")
    repo = next((args.workdir / "toy").glob("toy_*"))
    bwrap = [shutil.which("bwrap") or "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
             "--unshare-all", "--"]  # fmt: skip
    pytest = [sys.executable, "-B", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]
    agent_s = median_cpu_s([sys.executable, "-B", "-c", AGENT_IMPORTS], repo, args.runs)
    bare_bwrap_s = median_cpu_s([*bwrap, "true"], repo, args.runs)
    pytest_s = median_cpu_s(pytest, repo, args.runs)
    rollout_floor_s = 2 * bare_bwrap_s + agent_s + 2 * pytest_s

    console = Console()
    stages = Table(title=f"{args.workdir}: the run, against the aim of {AIM_S} s")
    stages.add_column("stage")
    stages.add_column("seconds", justify="right")
    for key, value in report["timings"].items():
        stages.add_row(key, f"{value:.0f}")
    updates_s = sum(step["train_s"] for arm in report["arms"].values() for step in arm["steps"])
    stages.add_row("the RL updates within the arms (train_s)", f"{updates_s:.0f}")
    stages.add_row("whole demo", f"{report['wall_seconds']:.0f}")
    console.print(stages)

    parts = Table(title=f"a rollout's wall time (median of {split.height} rollouts, from the store)")
    parts.add_column("part")
    parts.add_column("seconds", justify="right")
    for column, label in (("wall_ms", "whole rollout"), ("before_first_ms", "before the first model call"),
                          ("calls_ms", "model calls"), ("between_ms", "between calls (the agent's tools)"),
                          ("after_last_ms", "after the last call (report, grader)")):  # fmt: skip
        parts.add_row(label, f"{split[column].median() / 1000:.2f}")
    console.print(parts)

    floor = Table(title=f"the floor: the libraries alone, CPU-seconds timed now (median of {args.runs})")
    floor.add_column("what")
    floor.add_column("CPU seconds", justify="right")
    floor.add_row("bare bwrap, `true` (the agent's sandbox; the grader's too)", f"{bare_bwrap_s:.3f}")
    floor.add_row("a Python importing the agent's libraries", f"{agent_s:.2f}")
    floor.add_row("pytest on the visible tests, no sandbox (run_tests; the grader's too)", f"{pytest_s:.2f}")
    floor.add_row("one rollout's floor", f"{rollout_floor_s:.2f}")
    rollouts_floor_s = split.height * rollout_floor_s / CORES
    floor.add_row(f"{split.height} rollouts over {CORES} cores", f"{rollouts_floor_s:.0f}")
    console.print(floor)
    sft_s = report["timings"].get("sft_s", 0.0)
    console.print(
        f"whole demo {report['wall_seconds']:.0f} s against the aim of {AIM_S} s; beneath it the rollouts'"
        f" floor {rollouts_floor_s:.0f} s + the SFT stage {sft_s:.0f} s (at its floor: bench/coding_sft.py)"
        f" + the RL updates {updates_s:.0f} s (as measured; the trainer's floor: bench/train.py)"
        f" = {rollouts_floor_s + sft_s + updates_s:.0f} s"
    )


if __name__ == "__main__":
    main()
