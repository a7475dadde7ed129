"""`otel-rl archive`: move old raw rows into the store's Parquet archive, and apply retention; through the
server when one holds the store (POST /v1/admin/archive), else on the file itself."""

from __future__ import annotations

import os
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from otel_rl.store.retention import ArchivePolicy

ARCHIVE_TIMEOUT_S = 3600.0  # a run through the server: archiving a large store takes a while


class ArchiveFailed(RuntimeError):
    """The run was refused or failed; the message says why."""


def archive_command(
    before: Annotated[
        str | None,
        typer.Option(help="Archive the raw rows received before this day (YYYY-MM-DD, UTC; today at latest)"),
    ] = None,
    retain_days: Annotated[
        int | None,
        typer.Option(min=0, help="Then delete data received more than this many days ago (archived or not)"),
    ] = None,
    retain_bytes: Annotated[
        str | None,
        typer.Option(help="Then delete the oldest archived days while the archive is over (500MB, 20GiB...)"),
    ] = None,
    db: Annotated[
        Path | None, typer.Option(help="DuckDB file [env OTEL_RL_DB; default .otel_rl/otel_rl.duckdb]")
    ] = None,
    server: Annotated[
        str | None, typer.Option(help="Ask this otel-rl server [env OTEL_RL_SERVER; when it holds the file]")
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(help="Server token [env OTEL_RL_TOKEN; else OTEL_RL_TOKEN_FILE; else .otel_rl/token]"),
    ] = None,
) -> None:
    """Move raw rows (spans, call_tokens, logs, metric_points) received before --before into Parquet files
    beside the store (`<store>.archive/<table>/day=YYYY-MM-DD/`), where every query, view and export still
    reads them; then delete what --retain-days / --retain-bytes keep no more (docs/query.md#the-archive)."""
    from otel_rl.store.retention import ArchivePolicy, PolicyError, parse_size

    try:
        day = None if before is None else date.fromisoformat(before)
    except ValueError:
        raise typer.BadParameter(f"{before!r} is not a day (YYYY-MM-DD)", param_hint="--before") from None
    try:
        size = None if retain_bytes is None else parse_size(retain_bytes)
        policy = ArchivePolicy(day, retain_days, size)
        policy.check(_today())
    except PolicyError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        lines = _run(policy, db, server, token)
    except ArchiveFailed as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    for line in lines:
        typer.echo(line)


def _run(policy: ArchivePolicy, db: Path | None, server: str | None, token: str | None) -> list[str]:
    """The run on the store file, or through the server holding it (or `server`); its summary lines."""
    import duckdb

    from otel_rl.query import DEFAULT_SERVER
    from otel_rl.store import Store
    from otel_rl.store.archiver import ArchiveError
    from otel_rl.store.connection import connect, default_db
    from otel_rl.store.wal import StoreDamaged

    if server is not None:
        return _ask_server(server, policy, token, "asked for")
    path = db or default_db()
    if not path.is_file():
        raise ArchiveFailed(f"no otel-rl store at {path}")
    try:
        connect(path, read_only=True).close()  # only to learn whether a server holds the file
    except duckdb.IOException as exc:
        if "lock" not in str(exc).lower():
            raise ArchiveFailed(f"could not open {path}: {exc}") from None
        url = os.environ.get("OTEL_RL_SERVER") or DEFAULT_SERVER
        return _ask_server(url, policy, token, f"{path} is held by a running server")
    try:
        with Store(path) as store:
            return store.archive(policy).lines()
    except (StoreDamaged, ArchiveError, duckdb.Error, OSError) as exc:
        raise ArchiveFailed(f"the archive run failed: {exc}") from None


def _ask_server(url: str, policy: ArchivePolicy, token: str | None, why: str) -> list[str]:
    import httpx

    from otel_rl.auth import client_token
    from otel_rl.query import response_detail

    try:
        token = client_token(token)
    except ValueError as exc:  # OTEL_RL_TOKEN_FILE names a file without a token
        raise ArchiveFailed(str(exc)) from None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = {
        "before": None if policy.before is None else policy.before.isoformat(),
        "retain_days": policy.retain_days,
        "retain_bytes": policy.retain_bytes,
    }
    try:
        response = httpx.post(
            f"{url.rstrip('/')}/v1/admin/archive", json=body, headers=headers, timeout=ARCHIVE_TIMEOUT_S
        )
    except httpx.TransportError as exc:
        raise ArchiveFailed(f"{why}, but no otel-rl server answers at {url}: {exc}") from None
    if response.status_code != 200:
        raise ArchiveFailed(f"{url} answered {response.status_code}: {response_detail(response)}")
    return response.json()["summary"]


def _today() -> date:
    from datetime import UTC, datetime

    return datetime.now(UTC).date()
