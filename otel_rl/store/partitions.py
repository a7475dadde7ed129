"""Several stores queried as one: the partitions of a load-balanced ingest (collectors/README.md), each
written by its own otel-rl server, read together by `otel-rl sql|export|train --db A --db B` or
`--db 'parts/*.duckdb'`.

An in-memory database, attached under the store's catalog name (connection.CATALOG), ATTACHes each store
READ_ONLY and defines, for every name the stores expose, a view over all of them:
- each raw table: the UNION ALL BY NAME of every store's table and archived files (archive.py);
- each normalized table: the union of every store's. Each store computed its rows from its own raw rows, which
  is right while no rollout has records in two stores: the collector routes by rollout id to ensure it, and
  `split_rollouts` finds the rollouts for which it failed;
- the other views and the macros of transforms/*.sql: created here over those unions, as a store creates them;
- any other name (a table of the store's own): the union of the stores that have it.
It is then locked down as a store is (sandbox.py): user SQL reads it as it reads one store.
"""

from __future__ import annotations

import glob
import logging
from collections.abc import Sequence
from pathlib import Path

import duckdb
import pyarrow as pa

from otel_rl.store import archive
from otel_rl.store.connection import CATALOG, connect, quoted
from otel_rl.store.definitions import NORMALIZED, read_definitions
from otel_rl.store.detections import create_detections
from otel_rl.store.sandbox import Params, UserQuery, check_read_only, lock_down
from otel_rl.store.schema import default_transforms_dir

log = logging.getLogger(__name__)

GLOB_CHARACTERS = frozenset("*?[")
SPLIT_EXAMPLES = 3  # rollout ids named in the warning about rollouts split across stores


class PartitionError(RuntimeError):
    """A store of several cannot be read: missing, not a store, or held by a running server."""


def stores(names: Sequence[str | Path]) -> list[Path]:
    """The store files `names` name: each a path, or a glob ('parts/*.duckdb') that must match some file;
    in the order given (a glob's matches sorted), each file once. A name that is an existing file is that
    file, even when it holds glob characters ('run[1].duckdb')."""
    found: list[Path] = []
    for name in names:
        text = str(name)
        if GLOB_CHARACTERS & set(text) and not Path(text).exists():
            matches = sorted(glob.glob(text))
            if not matches:
                raise PartitionError(f"no file matches {text!r}")
            found += [Path(match) for match in matches]
        else:
            found.append(Path(text))
    unique = {path.resolve(): path for path in reversed(found)}
    return [path for path in found if unique[path.resolve()] is path]


def check_stores(paths: Sequence[Path]) -> None:
    """PartitionError naming the first existing file that is not an otel-rl store: not a DuckDB file, or a
    DuckDB file without the store's `spans` table (reading it as a store would write the store's tables into
    it). A file held by a running server is left to the server (or to `_attach`'s refusal)."""
    for path in paths:
        if not path.is_file():
            continue
        try:
            con = connect(path, read_only=True)
        except duckdb.Error as exc:
            if "lock" in str(exc).lower():
                continue
            raise PartitionError(f"{path} is not an otel-rl store ({exc}): leave it out of --db") from None
        try:
            [(found,)] = con.execute(
                "SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND schema_name = 'main'"
                " AND table_name = 'spans'",
                [CATALOG],
            ).fetchall()
        finally:
            con.close()
        if not found:
            raise PartitionError(
                f"{path} is not an otel-rl store (a DuckDB file without its tables): leave it out of --db"
            )


def query_stores(paths: Sequence[Path], sql: str, params: Params | None = None) -> tuple[pa.Table, list[str]]:
    """The result of one read-only statement over `paths` as one store (its parameters bound by DuckDB), and
    the rollouts that have records in more than one of them (sandbox errors as from one store;
    PartitionError)."""
    check_read_only(sql)  # before attaching anything: a write is refused the same way for one store or many
    con = connect_stores(paths)
    try:
        split = split_rollouts(con, len(paths))
        return UserQuery(con, sql, params=params).run(), split
    finally:
        con.close()


def connect_stores(paths: Sequence[Path]) -> duckdb.DuckDBPyConnection:
    """The stores as one locked-down database (see the module's docstring)."""
    con = duckdb.connect()
    try:
        for index, path in enumerate(paths):
            _attach(con, index, path)
        con.execute(f"ATTACH ':memory:' AS {CATALOG}")
        con.execute(f"USE {CATALOG}")
        attached = [f"p{index}" for index in range(len(paths))]
        names = _names(con, attached)
        for table in archive.ARCHIVED_TABLES:
            _create_union(
                con, table, [_raw_rows(con, index, path, table) for index, path in enumerate(paths)]
            )
        for name in NORMALIZED:
            _create_union(con, name, [f"SELECT * FROM p{index}.main.{name}" for index in names.get(name, ())])
        _create_transforms(con)
        defined = _names(con, [CATALOG])
        for name, indexes in sorted(names.items()):
            if name not in defined:
                _create_union(con, name, [f"SELECT * FROM p{index}.main.{name}" for index in indexes])
        archive.allow_reading(con, paths)
        lock_down(con)
    except BaseException:
        con.close()
        raise
    return con


def split_rollouts(con: duckdb.DuckDBPyConnection, count: int) -> list[str]:
    """The rollout ids named by records of more than one of the `count` attached stores (by their
    normalized.keys: what each commit's rows name)."""
    parts = [
        f"SELECT DISTINCT rollout_id, {index} AS part FROM p{index}.normalized.keys"
        " WHERE rollout_id IS NOT NULL"
        for index in range(count)
        if _has_keys(con, index)
    ]
    if len(parts) < 2:
        return []
    rows = con.execute(
        f"SELECT rollout_id FROM ({' UNION ALL '.join(parts)}) GROUP BY rollout_id HAVING count(*) > 1"
        " ORDER BY rollout_id"
    ).fetchall()
    return [rollout_id for (rollout_id,) in rows]


def split_message(split: Sequence[str]) -> str:
    """The warning for rollouts found in several stores."""
    examples = ", ".join(split[:SPLIT_EXAMPLES]) + (", ..." if len(split) > SPLIT_EXAMPLES else "")
    return (
        f"{len(split)} rollout(s) have records in more than one of the stores queried ({examples}): each"
        " store computed its views over its own records, so those rollouts' rows are wrong; route the"
        " collector by rollout id (collectors/README.md)"
    )


def _attach(con: duckdb.DuckDBPyConnection, index: int, path: Path) -> None:
    if not path.is_file():
        raise PartitionError(f"no store at {path}")
    try:
        con.execute(f"ATTACH {quoted(path)} AS p{index} (READ_ONLY)")
    except duckdb.IOException as exc:
        if "lock" not in str(exc).lower():
            raise PartitionError(f"{path} cannot be read: {exc}") from None
        raise PartitionError(
            f"{path} is held by a running otel-rl server, and DuckDB lets no other process open a file while"
            " one writes it: stop that server to query the stores together, or query this store alone"
            " through its server (--server URL)"
        ) from None
    except duckdb.Error as exc:
        raise PartitionError(f"{path} is not an otel-rl store: {exc}") from None


def _names(con: duckdb.DuckDBPyConnection, catalogs: list[str]) -> dict[str, list[int]]:
    """Each table and view name of the main schemas of `catalogs`: the indexes of those that have it."""
    rows = con.execute(
        "SELECT database_name, table_name FROM duckdb_tables() WHERE schema_name = 'main' AND NOT temporary"
        " UNION SELECT database_name, view_name FROM duckdb_views() WHERE schema_name = 'main'"
        " AND NOT internal AND NOT temporary"
    ).fetchall()
    names: dict[str, list[int]] = {}
    for catalog, name in sorted(rows):
        if catalog in catalogs:
            names.setdefault(name, []).append(catalogs.index(catalog))
    return names


def _raw_rows(con: duckdb.DuckDBPyConnection, index: int, path: Path, table: str) -> str:
    files = archive.manifest(con, f"p{index}")
    return archive.raw_rows(path, files, table, f"p{index}.main.{table}")


def _create_union(con: duckdb.DuckDBPyConnection, name: str, selects: Sequence[str]) -> None:
    if selects:
        union = " UNION ALL BY NAME ".join(f"SELECT * FROM ({select})" for select in selects)
        con.execute(f"CREATE VIEW {name} AS {union}")


def _create_transforms(con: duckdb.DuckDBPyConnection) -> None:
    """The macros and the views but the normalized ones of transforms/*.sql (the unions stand for those),
    in file order; a file that fails is left out from its failing statement on, as a store leaves it out."""
    for file in read_definitions(default_transforms_dir()):
        try:
            for statement in file.statements:
                if not statement.normalized:
                    con.execute(statement.sql)
        except duckdb.Error as exc:
            log.warning("the views of %s are not defined over the stores queried: %s", file.name, exc)
    create_detections(con)


def _has_keys(con: duckdb.DuckDBPyConnection, index: int) -> bool:
    [(found,)] = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND schema_name = 'normalized'"
        " AND table_name = 'keys'",
        [f"p{index}"],
    ).fetchall()
    return found > 0
