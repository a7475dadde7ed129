"""`otel-rl rollouts`: run a task file once through the configured controller, or revoke a rollout's keys."""

import asyncio
import hashlib
import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer


class Split(StrEnum):
    TRAIN = "train"
    VAL = "val"


rollouts_app = typer.Typer(
    help="Run rollouts outside training: local processes or Kubernetes Jobs.", no_args_is_help=True
)


def rollout_ids(run_id: str, task_index: int, sample: int) -> tuple[str, str]:
    """(rollout id, group id) fixed by run, task and sample: the same --run-id again adopts what a stopped
    run left on the cluster instead of starting it over."""
    digest = hashlib.sha256(f"{run_id}\0{task_index}\0{sample}".encode()).hexdigest()
    group = hashlib.sha256(f"{run_id}\0{task_index}".encode()).hexdigest()[:16]
    return digest[:32], f"{run_id}-{group}"


def result_line(result: Any) -> dict[str, Any]:
    """One rollout's result as a JSON line."""
    last = result.attempts[-1]
    return {
        "rollout_id": result.rollout.rollout_id,
        "group_id": result.rollout.group_id,
        "task_id": result.rollout.task_id,
        "status": result.status.value,
        "exit_code": last.exit_code,
        "trace_id": last.trace_id,
        "attempts": [
            {
                "attempt_id": a.attempt_id,
                "status": a.status.value,
                "exit_code": a.exit_code,
                "duration_s": round(a.duration_s, 3),
                "log": str(a.log_path),
            }
            for a in result.attempts
        ],
    }


@rollouts_app.command("run")
def run_command(
    tasks: Annotated[Path, typer.Argument(help="JSONL, one task (a JSON object with an `id`) per line")],
    config: Annotated[
        Path,
        typer.Option(
            "--config",
            "-c",
            help="Training configuration (YAML): its "
            "`online` (harness, limits), `controller` and `server` sections",
        ),
    ],
    n: Annotated[int, typer.Option("--n", min=1, max=1024, help="Rollouts per task (one group)")] = 1,
    split: Annotated[Split, typer.Option(help="The rollouts' otel_rl.split")] = Split.VAL,
    run_id: Annotated[
        str, typer.Option(help="Names this run's Jobs; repeat it to resume a stopped run")
    ] = "",
) -> None:
    """Run every task of TASKS n times; print a table (stderr) and one JSON line per rollout (stdout)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from otel_rl.controller.rollouts import Rollout, new_id
    from otel_rl.input_rules import check_id
    from otel_rl.train.config import ConfigError, load_config
    from otel_rl.train.controllers import open_runner, train_settings
    from otel_rl.train.server_client import ServerClient, server_token
    from otel_rl.train.tasks import read_tasks

    console = Console(stderr=True)
    try:
        settings = load_config(config)
        if not settings.online.harness:
            raise ConfigError(f"{config}: `online.harness` (the command each rollout runs) is not set")
        run_id = run_id or f"rollouts-{new_id()[:12]}"
        listed = read_tasks(tasks)
        log_dir = settings.output_dir / "rollouts-run" / run_id
        controller_settings = train_settings(settings, log_dir)
        client = ServerClient(settings.server.url, server_token(settings))
        rollouts = []
        for index, task in enumerate(listed):
            for sample in range(n):
                rollout_id, group_id = rollout_ids(run_id, index, sample)
                check_id(group_id, "the group id made of --run-id")  # the rule of every identity value
                rollouts.append(Rollout(rollout_id, group_id, task.task_id, task.payload, split.value))
        runner = open_runner(settings, client, controller_settings, run_id)
        results = asyncio.run(_run(runner, rollouts))
    except (ConfigError, ValueError, OSError, RuntimeError) as error:
        console.print(f"[red]error:[/] {escape(str(error))}")
        raise typer.Exit(1) from None
    table = Table(title=f"run {run_id}: {len(results)} rollouts")
    for column in ("task", "rollout", "status", "exit", "attempts", "seconds"):
        table.add_column(column)
    for result in results:
        last = result.attempts[-1]
        table.add_row(
            escape(result.rollout.task_id),
            result.rollout.rollout_id[:12],
            result.status.value,
            "" if last.exit_code is None else str(last.exit_code),
            str(len(result.attempts)),
            f"{sum(a.duration_s for a in result.attempts):.1f}",
        )
    console.print(table)
    for result in results:
        sys.stdout.write(json.dumps(result_line(result)) + "\n")


async def _run(runner: Any, rollouts: list[Any]) -> list[Any]:
    try:
        return list(await asyncio.gather(*(runner.run_rollout(rollout) for rollout in rollouts)))
    finally:
        await runner.aclose()


@rollouts_app.command("revoke-key")
def revoke_key_command(
    rollout_id: Annotated[str, typer.Argument(help="The rollout whose keys stop working")],
    attempt_id: Annotated[
        str | None, typer.Option(help="Only this attempt's key (default: every key of the rollout)")
    ] = None,
    server: Annotated[
        str | None,
        typer.Option(help="The otel-rl server [env OTEL_RL_SERVER; default http://127.0.0.1:4318]"),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(help="Admin token [env OTEL_RL_TOKEN; else OTEL_RL_TOKEN_FILE; else .otel_rl/token]"),
    ] = None,
) -> None:
    """Revoke a rollout's keys (docs/security.md): the harness holding one is refused from now on."""
    import os

    import httpx

    from otel_rl.auth import client_token
    from otel_rl.query import DEFAULT_SERVER, response_detail

    url = (server or os.environ.get("OTEL_RL_SERVER") or DEFAULT_SERVER).rstrip("/")
    try:
        admin = client_token(token)
        response = httpx.delete(
            f"{url}/v1/admin/rollouts/{rollout_id}/key",
            params={"attempt_id": attempt_id} if attempt_id else {},
            headers={"Authorization": f"Bearer {admin}"} if admin else {},
            timeout=30,
        )
    except (ValueError, httpx.TransportError) as error:  # a token file without a token; no server there
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    if response.status_code != 200:
        typer.echo(f"error: {url} answered {response.status_code}: {response_detail(response)}", err=True)
        raise typer.Exit(1)
    which = f"attempt {attempt_id} of rollout {rollout_id}" if attempt_id else f"rollout {rollout_id}"
    typer.echo(f"revoked {response.json()['revoked']} key(s) of {which}")
