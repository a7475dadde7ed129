"""SQL over the store: `otel_rl.query(sql) -> polars.DataFrame` and `otel-rl sql`, with or without the server.

DuckDB lets one process write a file: while `otel-rl serve` holds it, queries go through its /v1/query
endpoint; otherwise the file is opened read-only here. Several files (the partitions of a load-balanced
ingest) are read as one (otel_rl/store/partitions.py).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    import httpx
    import polars as pl
    import pyarrow as pa
    from rich.console import Console

    from otel_rl.store.sandbox import Params

DEFAULT_DB = Path(".otel_rl") / "otel_rl.duckdb"
DEFAULT_SERVER = "http://127.0.0.1:4318"
# On each /v1/query answer: no row the statement read was written after this commit. Sent back as the body's
# `after_commit`, it makes a read of the normalized tables wait for that commit only, not for every later one.
SEEN_THROUGH_HEADER = "OTel-RL-Seen-Through"


class QueryError(RuntimeError):
    """The query was refused or failed; the message says why."""


class SplitRollouts(UserWarning):
    """Rollouts have records in more than one of the stores queried together: their rows are wrong."""


class CatchingUp(UserWarning):
    """A store file's normalized tables lack commits (its server stopped first): normalized before reading."""


Stores = str | Path | Sequence[str | Path]  # one store file, a glob of them ('parts/*.duckdb'), or several


def query(
    sql: str,
    params: Params | None = None,
    *,
    db: Stores | None = None,
    server: str | None = None,
    token: str | None = None,
) -> pl.DataFrame:
    """Run one read-only SQL statement over the store's tables and views, its parameters (`$1` or `?` with a
    list, `$name` with a dict) bound by DuckDB.

    With `server`, ask that server. Otherwise open the DuckDB file (`db`, else OTEL_RL_DB, else
    .otel_rl/otel_rl.duckdb) read-only, or, when a running server holds it (or there is no file and no
    `db` was named), ask the server at OTEL_RL_SERVER, else http://127.0.0.1:4318. Several files (`db` a list
    or a glob) are read as one store, each read-only (none may be held by a server); a SplitRollouts warning
    names the rollouts that have records in more than one.
    """
    import polars as pl

    why_server = "asked for"
    if server is None:
        from otel_rl.store.partitions import PartitionError, check_stores, stores

        named = db if db is not None else os.environ.get("OTEL_RL_DB") or DEFAULT_DB
        try:
            paths = stores([named] if isinstance(named, str | Path) else named)
            check_stores(paths)  # before anything opens one as a store (which would write into it)
        except PartitionError as exc:
            raise QueryError(str(exc)) from None
        _catch_up(paths)
        if len(paths) != 1:
            return pl.from_arrow(_query_stores(paths, sql, params))
        path = paths[0]
        if path.exists():
            table = _query_file(path, sql, params)
            if table is not None:
                return pl.from_arrow(table)
            why_server = f"{path} is held by a running server"
        elif db is not None:
            raise QueryError(f"no otel-rl database at {path}")
        else:
            why_server = f"there is no database at {path}"
    url = server or os.environ.get("OTEL_RL_SERVER") or DEFAULT_SERVER
    return pl.from_arrow(_query_server(url, sql, params, token, why_server))


def _catch_up(paths: list[Path]) -> None:
    """Normalize what each store file's tables lack before it is read (commits its server wrote but stopped
    before normalizing, or a store made by an earlier version), unless a server holds it (it does that)."""
    import duckdb

    from otel_rl.store.store import catch_up, normalized_lag

    for path in paths:
        try:
            lag = normalized_lag(path) if path.is_file() else None
        except duckdb.Error as exc:  # e.g. a damaged store: one line, as every refusal
            raise QueryError(f"{path} cannot be read: {exc}") from None
        if not lag:
            continue
        warnings.warn(f"{path}: normalizing {lag} commit(s) first", CatchingUp, stacklevel=3)
        try:
            catch_up(path)
        except duckdb.Error as exc:
            if "lock" not in str(exc).lower():  # else a server took it meanwhile, and normalizes it
                warnings.warn(f"{path} cannot be normalized ({exc}): read as it is", CatchingUp, stacklevel=3)


def _query_stores(paths: list[Path], sql: str, params: Params | None) -> pa.Table:
    """The result over several store files read as one (none held by a server)."""
    from otel_rl.store.partitions import PartitionError, query_stores, split_message
    from otel_rl.store.sandbox import QueryFailed, ReadOnlyViolation

    if not paths:
        raise QueryError("no store named: give --db FILE (repeatable) or a glob")
    try:
        table, split = query_stores(paths, sql, params)
    except PartitionError as exc:
        raise QueryError(str(exc)) from None
    except ReadOnlyViolation as exc:
        raise QueryError(f"query refused: {exc}") from None
    except QueryFailed as exc:
        raise QueryError(f"query failed: {exc}") from None
    if split:
        warnings.warn(split_message(split), SplitRollouts, stacklevel=3)
    return table


def _query_file(path: Path, sql: str, params: Params | None) -> pa.Table | None:
    """The result from the file opened read-only in the sandbox (as the server runs queries, its archived rows
    included), or None when a server holds the file's lock."""
    from functools import partial

    import duckdb

    from otel_rl.store import archive
    from otel_rl.store.connection import connect
    from otel_rl.store.sandbox import QueryFailed, ReadOnlyViolation, UserQuery, check_read_only, lock_down

    try:
        check_read_only(sql)  # before opening: a write is refused the same way whoever holds the file
    except ReadOnlyViolation as exc:
        raise QueryError(str(exc)) from None
    try:
        con = connect(path, read_only=True)
    except duckdb.IOException as exc:
        if "lock" in str(exc).lower():
            return None
        raise QueryError(f"could not open {path}: {exc}") from None
    try:
        files = archive.manifest(con)
        archive.allow_reading(con, [path])
        lock_down(con)
        prepare = partial(archive.shadow_raw_tables, store_path=path, files=files)
        return UserQuery(con, sql, prepare=prepare, params=params).run()
    except ReadOnlyViolation as exc:
        raise QueryError(f"query refused: {exc}") from None
    except QueryFailed as exc:
        raise QueryError(f"query failed: {exc}") from None
    finally:
        con.close()


def _query_server(url: str, sql: str, params: Params | None, token: str | None, why_server: str) -> pa.Table:
    import httpx

    from otel_rl.auth import client_token

    try:
        token = client_token(token)
    except ValueError as exc:  # OTEL_RL_TOKEN_FILE names a file without a token
        raise QueryError(str(exc)) from None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = {"sql": sql} if params is None else {"sql": sql, "params": params}
    try:
        response = httpx.post(f"{url.rstrip('/')}/v1/query", json=body, headers=headers, timeout=300)
    except httpx.TransportError as exc:
        raise QueryError(f"{why_server}, but no otel-rl server answers at {url}: {exc}") from None
    return query_result(response, url)


def query_result(response: httpx.Response, url: str) -> pa.Table:
    """The table of a /v1/query response; a QueryError with the server's message for any other status."""
    import pyarrow as pa

    if response.status_code != 200:
        raise QueryError(f"{url} answered {response.status_code}: {response_detail(response)}")
    return pa.ipc.open_stream(response.content).read_all()


def response_detail(response: object) -> str:
    """The message of an error answer of the server (its JSON `detail`, else its text)."""
    try:
        return str(response.json()["detail"])  # type: ignore[attr-defined]
    except (ValueError, KeyError, TypeError):
        return response.text  # type: ignore[attr-defined]


class OutputFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"
    parquet = "parquet"


DB_HELP = (
    "DuckDB file; repeat it, or give a quoted glob ('parts/*.duckdb'), to query several stores as one"
    " [env OTEL_RL_DB; default .otel_rl/otel_rl.duckdb]"
)


@contextmanager
def warnings_as_lines(console: Console) -> Iterator[None]:
    """Print each SplitRollouts or CatchingUp warning raised inside once, as one line (a command's stderr)."""
    with warnings.catch_warnings():
        warnings.simplefilter("once", SplitRollouts)
        warnings.simplefilter("once", CatchingUp)
        shown = warnings.showwarning

        def show(message, category, *rest) -> None:  # noqa: ANN001 - warnings.showwarning's signature
            if issubclass(category, SplitRollouts | CatchingUp):
                console.print(f"[yellow]warning:[/] {message}", soft_wrap=True, highlight=False)
            else:
                shown(message, category, *rest)

        warnings.showwarning = show
        yield


def sql_command(
    sql: Annotated[str, typer.Argument(help="One read-only SQL statement (SELECT, WITH, DESCRIBE, SHOW)")],
    db: Annotated[list[Path] | None, typer.Option(help=DB_HELP)] = None,
    server: Annotated[str | None, typer.Option(help="Ask this otel-rl server [env OTEL_RL_SERVER]")] = None,
    token: Annotated[
        str | None,
        typer.Option(help="Server token [env OTEL_RL_TOKEN; else OTEL_RL_TOKEN_FILE; else .otel_rl/token]"),
    ] = None,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", help="Output format")
    ] = OutputFormat.table,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write to this file")] = None,
) -> None:
    """Run SQL over the stored traces and views (through the server when it is running)."""
    from rich.console import Console

    from otel_rl.csv_text import csv_text

    stderr = Console(stderr=True)
    try:
        with warnings_as_lines(stderr):
            frame = query(sql, db=db, server=server, token=token)
    except QueryError as exc:
        stderr.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None
    if output_format is OutputFormat.parquet:
        if output is None:
            raise typer.BadParameter("parquet needs an output file: -o FILE", param_hint="--format")
        frame.write_parquet(output)
    elif output_format is OutputFormat.table:
        from otel_rl.query_table import fitting_table

        console = Console(file=output.open("w") if output else None, width=200 if output else None)
        console.print(fitting_table(frame, console.width))
    else:
        text = csv_text(frame) if output_format is OutputFormat.csv else frame.write_json()
        if output:
            output.write_text(text)
        else:
            typer.echo(text, nl=False)
