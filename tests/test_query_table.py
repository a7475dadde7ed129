"""`otel-rl sql`'s table shows the columns that fit the terminal and says how many it hid."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_collector_http import spans_request

from otel_rl.collector.ingest import ingest_traces
from otel_rl.query_table import shown_columns
from otel_rl.store import Store

OTEL_RL = str(Path(sys.executable).parent / "otel-rl")


@pytest.fixture(scope="module")
def store_with_spans(tmp_path_factory) -> tuple[Path, str]:
    db = tmp_path_factory.mktemp("table") / "otel_rl.duckdb"
    request, trace_id = spans_request(2)
    with Store(db) as store:
        ingest_traces(store, request)
    return db, trace_id


def sql(db: Path, statement: str, columns: int) -> str:
    result = subprocess.run(
        [OTEL_RL, "sql", "--db", str(db), statement],
        capture_output=True,
        text=True,
        env=os.environ | {"COLUMNS": str(columns)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("columns", [80, 200])
def test_select_star_shows_the_first_and_last_columns_that_fit_and_counts_the_hidden(
    store_with_spans, columns
) -> None:
    db, trace_id = store_with_spans
    total = int(sql(db, "SELECT count(*) AS n FROM (DESCRIBE spans)", 80).split("│")[1])
    table = sql(db, f"SELECT * FROM spans WHERE trace_id = '{trace_id}'", columns)

    lines = table.splitlines()
    assert max(len(line) for line in lines) <= columns
    header = lines[1]
    names = [cell.strip() for cell in header.strip("┃").split("┃")]
    assert names[0] == "trace_id" and "…" in names
    shown = len(names) - 1
    # Every shown value is visible (not a column squeezed to nothing): the trace id starts in its cell.
    assert trace_id[:8] in lines[3]
    caption = " ".join(line.strip() for line in lines[5:])
    assert f"2 row(s), {total} columns ({shown} shown, {total - shown} hidden" in caption


def test_columns_that_fit_are_all_shown_and_long_values_fold(store_with_spans) -> None:
    db, trace_id = store_with_spans
    table = sql(
        db, f"SELECT name, trace_id || repeat('x', 150) AS long FROM spans WHERE trace_id = '{trace_id}'", 80
    )
    assert "hidden" not in table and "…" not in table
    assert table.count("x") >= 300  # both values whole, folded over lines


def test_columns_are_taken_from_both_ends_until_the_width_is_spent() -> None:
    assert shown_columns([12] * 3, 80) == [0, 1, 2]
    # 12 + 3 per column, 1 for the outer border, 4 for the gap's column: 80 characters hold 5.
    assert shown_columns([12] * 40, 80) == [0, 1, 2, 38, 39]
    assert shown_columns([12] * 40, 20) == [0]
    assert shown_columns([12] * 40, 19) == []
