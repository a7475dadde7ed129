"""`otel-rl tasks load` and `otel-rl tasks curate`: task files and the store, on its file or through the
server holding it (as `otel-rl archive` and `otel-rl sql` choose)."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from otel_rl.coding.tasks import TaskError, TaskSet, load_tasks

if TYPE_CHECKING:
    from otel_rl.coding.task_table import TasksIn

DbOption = Annotated[
    Path | None, typer.Option(help="DuckDB file [env OTEL_RL_DB; default .otel_rl/otel_rl.duckdb]")
]
ServerOption = Annotated[
    str | None, typer.Option(help="Ask this otel-rl server [env OTEL_RL_SERVER; when it holds the file]")
]
TokenOption = Annotated[
    str | None,
    typer.Option(help="Server token [env OTEL_RL_TOKEN; else OTEL_RL_TOKEN_FILE; else .otel_rl/token]"),
]
LOAD_TIMEOUT_S = 300.0


class LoadFailed(RuntimeError):
    """The load was refused or failed; the message says why."""


def _task_set(path: Path) -> TaskSet:
    try:
        return load_tasks(path)
    except TaskError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None


def load_command(
    file: Annotated[Path, typer.Argument(help="a JSONL task file", show_default=False)],
    task_set: Annotated[
        str | None, typer.Option("--set", help="the set's name in the table [default: the file's stem]")
    ] = None,
    db: DbOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Store the tasks' public fields in the store's `tasks` table, one row a task (never `test_patch` nor
    `patch`: they stay in the file). Loading the same file again adds nothing."""
    from otel_rl.coding.task_table import tasks_in

    try:
        body = tasks_in(_task_set(file), task_set)
        loaded = _load(body, db, server, token)
    except LoadFailed as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{loaded} tasks of {file} in the tasks table as set {body.task_set!r}")


def _load(body: TasksIn, db: Path | None, server: str | None, token: str | None) -> int:
    """Write on the store file, or through the server holding it (or `server`)."""
    import duckdb

    from otel_rl.coding.task_table import store_tasks
    from otel_rl.query import DEFAULT_SERVER
    from otel_rl.store import Store
    from otel_rl.store.connection import connect, default_db
    from otel_rl.store.partitions import PartitionError, check_stores

    if server is not None:
        return _ask_server(server, body, token, "asked for")
    path = db or default_db()
    url = os.environ.get("OTEL_RL_SERVER") or DEFAULT_SERVER
    if not path.is_file():
        if db is None:
            return _ask_server(url, body, token, f"there is no store at {path}")
    else:
        try:
            check_stores([path])  # a DuckDB file of something else is refused, not made into a store
            connect(path, read_only=True).close()  # only to learn whether a server holds the file
        except PartitionError as exc:
            raise LoadFailed(str(exc)) from None
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower():
                raise LoadFailed(f"could not open {path}: {exc}") from None
            return _ask_server(url, body, token, f"{path} is held by a running server")
    try:
        with Store(path) as store:
            return store_tasks(store, body)
    except (duckdb.Error, OSError) as exc:
        raise LoadFailed(f"storing the tasks in {path} failed: {exc}") from None


def _ask_server(url: str, body: TasksIn, token: str | None, why: str) -> int:
    import httpx

    from otel_rl.auth import client_token
    from otel_rl.query import response_detail

    try:
        token = client_token(token)
    except ValueError as exc:  # OTEL_RL_TOKEN_FILE names a file without a token
        raise LoadFailed(str(exc)) from None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.post(
            f"{url.rstrip('/')}/v1/admin/tasks",
            content=body.model_dump_json(),
            headers={**headers, "Content-Type": "application/json"},
            timeout=LOAD_TIMEOUT_S,
        )
    except httpx.TransportError as exc:
        raise LoadFailed(f"{why}, but no otel-rl server answers at {url}: {exc}") from None
    if response.status_code != 200:
        raise LoadFailed(f"{url} answered {response.status_code}: {response_detail(response)}")
    return int(response.json()["tasks"])


def curate_command(
    file: Annotated[Path, typer.Argument(help="the probed JSONL task file", show_default=False)],
    out: Annotated[Path, typer.Option("--out", help="the curated task file to write (same format)")],
    always_fail_share: Annotated[
        float, typer.Option(help="the most of the curated set always-fail tasks may be")
    ] = 0.2,
    exclude_repos_of: Annotated[
        Path | None, typer.Option(help="an evaluation task file: tasks of its repositories are left out")
    ] = None,
    seed: Annotated[int, typer.Option(help="draws the always-fail tasks kept")] = 0,
    probe_id: Annotated[
        str | None, typer.Option(help="only this probe run's rollouts (otel-rl tasks probe) [default: all]")
    ] = None,
    db: Annotated[list[Path] | None, typer.Option(help="DuckDB file [env OTEL_RL_DB]")] = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Select the tasks to train on by their probes' trusted rewards in the store (rollouts.task_id): mixed
    outcomes plus a capped share of always-fail tasks; tasks a flagged rollout passed go to
    `<out stem>.audit.jsonl`. Prints one JSON summary line."""
    import json

    from otel_rl.coding.curate import curate
    from otel_rl.query import QueryError, query
    from otel_rl.store import reads

    tasks = _task_set(file).tasks
    eval_repos = {task.repo for task in _task_set(exclude_repos_of).tasks} if exclude_repos_of else set()
    try:
        outcomes = reads.probe_outcomes(partial(query, db=db, server=server, token=token), probe_id)
        share = always_fail_share
        chosen = curate(tasks, outcomes, always_fail_share=share, eval_repos=eval_repos, seed=seed)
    except (QueryError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    # Each task whole, in the file's order: its grader-side fields come from the file, never from the store.
    lines = {task.instance_id: task.model_dump_json() for task in tasks}
    out.write_text("".join(lines[task.instance_id] + "\n" for task in chosen.selected))
    audit = out.parent / f"{out.stem}.audit.jsonl"
    audit.write_text("".join(lines[task.instance_id] + "\n" for task in chosen.audit))
    summary = {
        "mixed": len(chosen.mixed), "always_fail": len(chosen.always_fail), "audit": len(chosen.audit),
        "excluded_repos": len(chosen.excluded_repos), "dropped": chosen.dropped,
    }  # fmt: skip
    typer.echo(json.dumps(summary))
