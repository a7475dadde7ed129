"""`otel-rl store check` and `otel-rl store recover` (the work is in otel_rl/store/check.py)."""

from pathlib import Path
from typing import Annotated

import typer

store_app = typer.Typer(help="Check a store file, or recover one whose WAL is damaged (server stopped).")

DbOption = Annotated[
    Path | None, typer.Option(help="DuckDB file [env OTEL_RL_DB; default .otel_rl/otel_rl.duckdb]")
]


def _db(db: Path | None) -> Path:
    from otel_rl.store.connection import default_db

    return db or default_db()


@store_app.command("check")
def check_command(db: DbOption = None) -> None:
    """Report whether the store opens, its WAL's state, every table's rows and whether every view can be
    created; exit 1 on damage, 2 when a running server holds the file. Changes nothing (the WAL is replayed
    in memory only)."""
    from otel_rl.store.check import check_store

    report = check_store(_db(db))
    for line in report.lines:
        typer.echo(line)
    if report.in_use:
        raise typer.Exit(2)
    if report.damaged:
        typer.echo(f"the store {report.db} is damaged: see `otel-rl store recover --help`", err=True)
        raise typer.Exit(1)
    typer.echo("ok")


@store_app.command("recover")
def recover_command(db: DbOption = None) -> None:
    """Keep copies of a damaged store and its WAL, replay the WAL up to its first damaged entry, and open
    the store without the rest; reports what was replayed and what was dropped. Stop the server first."""
    from otel_rl.store.check import recover_store

    report = recover_store(_db(db))
    for line in report.lines:
        typer.echo(line)
    if not report.recovered:
        raise typer.Exit(1)
