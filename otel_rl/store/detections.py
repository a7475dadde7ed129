"""The `detections` view: the union of every `detect_*` view the transforms files define (docs/coding.md
"Detectors"), made when the views are created, so that a new detector is one new SQL file."""

from __future__ import annotations

import logging

import duckdb

log = logging.getLogger(__name__)

PREFIX = "detect_"
# The columns of a detector's rows, in order: those of the placeholder `detections` of 70_detections.sql.
COLUMNS = ("rollout_id", "detector", "evidence_id", "evidence", "trace_id", "span_id")


def detector_views(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The views of the current database whose name starts with `detect_`, by name."""
    rows = con.execute(
        "SELECT view_name FROM duckdb_views() WHERE database_name = current_database()"
        " AND schema_name = 'main' AND starts_with(view_name, ?) ORDER BY view_name",
        [PREFIX],
    ).fetchall()
    return [name for (name,) in rows]


def _select(view: str) -> str:
    columns = ", ".join(f'CAST("{column}" AS VARCHAR) AS {column}' for column in COLUMNS)
    quoted = view.replace('"', '""')  # a name from the catalog, quoted: one identifier whatever it holds
    return f'SELECT {columns} FROM "{quoted}"'


def create_detections(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """Replace `detections` (when the transforms define it) by the union of the detector views that have the
    documented columns; the others by name with their error, logged and left out: one broken detector
    does not silence the rest."""
    defined = con.execute(
        "SELECT count(*) FROM duckdb_views() WHERE database_name = current_database()"
        " AND schema_name = 'main' AND view_name = 'detections'"
    ).fetchone()
    if not defined or not defined[0]:
        return {}
    selects, errors = [], {}
    for view in detector_views(con):
        try:
            con.execute(f"DESCRIBE {_select(view)}")
        except duckdb.Error as exc:
            log.error("detector %s is left out of hack_flags: %s", view, exc)
            errors[view] = str(exc)
            continue
        selects.append(_select(view))
    if selects:
        con.execute("CREATE OR REPLACE VIEW detections AS\n" + "\nUNION ALL\n".join(selects))
    return errors
