"""The normalized tables of a store file against the views computed from scratch over its raw rows."""

from pathlib import Path

from otel_rl.store.connection import CATALOG, connect
from otel_rl.store.definitions import NORMALIZED, read_definitions
from otel_rl.store.layout import RAW_TABLES
from otel_rl.store.schema import default_transforms_dir


def differences(db: Path) -> dict[str, tuple[int, int]]:
    """Per normalized table: (rows the table lacks, rows it has too many) against its view computed from
    scratch over all the raw rows, as multisets. The store must be closed (or opened by nobody else)."""
    con = connect(db, read_only=True)
    try:
        con.execute("USE memory")
        for layout in RAW_TABLES:
            con.execute(f"CREATE VIEW {layout.table} AS FROM {CATALOG}.main.{layout.table}")
        for file in read_definitions(default_transforms_dir()):
            for statement in file.statements:
                con.execute(statement.sql)
        found = {}
        for name in NORMALIZED:
            stored, scratch = f"{CATALOG}.main.{name}", f"memory.main.{name}"
            (missing,) = con.execute(
                f"SELECT count(*) FROM (FROM {scratch} EXCEPT ALL FROM {stored})"
            ).fetchone()
            (extra,) = con.execute(
                f"SELECT count(*) FROM (FROM {stored} EXCEPT ALL FROM {scratch})"
            ).fetchone()
            found[name] = (missing, extra)
        return found
    finally:
        con.close()
