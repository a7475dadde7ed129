"""Time to first render of the web view's rollouts page and of a sample's inspector, over a store of 1M calls.

The store is filled through the real ingest path (OTLP/HTTP into `otel-rl serve`: two-call gateway rollouts
with exact token ids, a grader's reward each), then bulk-copied under new trace, rollout and group ids (as
commits after the stored ones, which the server normalizes when it opens the store again) until `llm_calls`
has --calls rows. Each page is timed in headless Chromium (navigate → the page drawn from its data), its JSON
endpoint over HTTP, and the floor: the endpoint's SQL alone in DuckDB (one thread, as the server runs it).

Run: .venv/bin/python bench/ui.py [--calls 1000000] [--base-rollouts 512]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import httpx
import polars as pl
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from otel_rl_server import ServerProcess  # noqa: E402 - the tests' real-server helper
from test_ui_api import emit_rollout  # noqa: E402 - a gateway-recorded two-call rollout
from test_ui_pages import chromium, with_page  # noqa: E402 - the DevTools driver

from otel_rl.store import ui_reads  # noqa: E402
from otel_rl.store.connection import connect  # noqa: E402
from otel_rl.ui.inspector import Tokenizer, rollout_samples  # noqa: E402

PREFIX = "bench-"  # every rollout and group id starts so: a copy renames them all by one replace
console = Console()


def fill(server: ServerProcess, rollouts: int) -> None:
    """`rollouts` rollouts of 2 calls, in groups of 4, through the server's OTLP/HTTP receiver."""
    for i in range(rollouts):
        emit_rollout(server, rollout_id=f"{PREFIX}r{i}", group_id=f"{PREFIX}g{i // 4}", reward=float(i % 2))


def multiply(db: Path, target_calls: int) -> int:
    """Copy spans and their token rows under new trace, rollout and group ids (and a later start) until
    llm_calls has at least `target_calls` rows."""
    con = duckdb.connect(str(db))
    (calls,) = con.execute("SELECT count(*) FROM call_tokens").fetchone()
    while 0 < calls < target_calls:
        factor = min(16, -(-target_calls // calls))
        renamed = f"replace(attributes::VARCHAR, '{PREFIX}', '{PREFIX}' || copy::VARCHAR || '.')::JSON"
        # the identity columns the collector resolved at ingest, renamed as the attributes are
        identity = ", ".join(
            f"replace({column}, '{PREFIX}', '{PREFIX}' || copy::VARCHAR || '.') AS {column}"
            for column in ("rollout_id", "attempt_id", "group_id", "task_id")
        )
        # Each copy as commits after every stored one: the server normalizes them when it opens the store.
        (last,) = con.execute("SELECT max(commit_seq) FROM spans").fetchone()
        commit = f"commit_seq + copy * {last} AS commit_seq"
        con.execute(
            "INSERT INTO spans SELECT spans.* REPLACE (md5(trace_id || copy::VARCHAR)[:32] AS trace_id,"
            f" {renamed} AS attributes, {identity},"
            " start_time_unix_nano + copy * 1000000000 AS start_time_unix_nano,"
            f" end_time_unix_nano + copy * 1000000000 AS end_time_unix_nano, {commit})"
            f" FROM spans, range(1, {factor}) AS copies(copy)"
        )
        con.execute(
            "INSERT INTO call_tokens SELECT call_tokens.*"
            f" REPLACE (md5(trace_id || copy::VARCHAR)[:32] AS trace_id, {commit})"
            f" FROM call_tokens, range(1, {factor}) AS copies(copy)"
        )
        con.execute("CHECKPOINT")
        (calls,) = con.execute("SELECT count(*) FROM call_tokens").fetchone()
        console.print(f"  {calls:,} calls")
    con.close()
    return calls


def best_of(n: int, fn) -> float:  # noqa: ANN001
    best = float("inf")
    for _ in range(n):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def render_times(server: ServerProcess, rollout_id: str) -> tuple[float, float]:
    """Seconds from navigation to the drawn page: the rollouts page (from the token link), an inspector."""
    times: list[float] = []

    async def scenario(page) -> None:  # noqa: ANN001 - test_ui_pages.Page
        for route in ("", f"#/sample/{rollout_id}"):
            start = time.perf_counter()
            url = f"{server.http_url}/ui/" + (route or f"#token={server.token}")
            page_timeout = 600.0
            await page.send("Page.navigate", url=url)
            expected = route or "#/rollouts"
            await page.wait_for(
                f"document.body?.dataset.rendered === '{expected}'", url, timeout_s=page_timeout
            )
            times.append(time.perf_counter() - start)
        assert page.errors == [], page.errors

    with chromium() as endpoint:
        asyncio.run(with_page(endpoint, scenario))
    return times[0], times[1]


def floors(db: Path, rollout_id: str) -> tuple[float, float]:
    """The endpoints' SQL alone in DuckDB (read-only, one thread): the rollouts page's statement, and the
    statements the inspector runs for one rollout (timed as it runs them, without its Python work)."""
    con = connect(db, read_only=True)
    spent = 0.0

    def timed(sql: str, params: list | dict | None = None) -> pl.DataFrame:
        nonlocal spent
        start = time.perf_counter()
        table = con.sql(sql, params=params).to_arrow_table()
        spent += time.perf_counter() - start
        return pl.from_arrow(table)

    rollouts_s = best_of(3, lambda: ui_reads.rollouts_page(timed))
    inspector = []
    for _ in range(3):
        spent = 0.0
        rollout_samples(rollout_id, timed, Tokenizer(None))
        inspector.append(spent)
    con.close()
    return rollouts_s, min(inspector)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=1_000_000, help="llm_calls rows in the store")
    parser.add_argument("--base-rollouts", type=int, default=512, help="rollouts ingested over OTLP/HTTP")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        db = Path(workdir) / "ui.duckdb"
        server = ServerProcess(db, Path(workdir)).start()
        start = time.perf_counter()
        try:
            fill(server, args.base_rollouts)
        finally:
            server.stop()
        console.print(
            f"ingested {args.base_rollouts} rollouts over OTLP/HTTP in {time.perf_counter() - start:.1f} s"
        )
        calls = multiply(db, args.calls)
        rollout_id = f"{PREFIX}r1"
        server = ServerProcess(db, Path(workdir), flags=("--query-timeout", "900")).start()
        try:
            api = {}
            for name, path in (
                ("rollouts", "/ui/api/rollouts"),
                ("inspector", f"/ui/api/rollouts/{rollout_id}/samples"),
            ):
                api[name] = best_of(
                    3,
                    lambda p=path: httpx.get(
                        server.http_url + p, headers=server.auth, timeout=900
                    ).raise_for_status(),
                )
            rollouts_render, inspector_render = render_times(server, rollout_id)
        finally:
            server.stop()
        rollouts_floor, inspector_floor = floors(db, rollout_id)
        console.print(
            f"\n[bold]web view over {calls:,} calls[/] ({calls // 2:,} rollouts), one DuckDB thread"
        )
        for name, render, endpoint, floor in (
            ("rollouts page", rollouts_render, api["rollouts"], rollouts_floor),
            ("sample inspector", inspector_render, api["inspector"], inspector_floor),
        ):
            console.print(
                f"  {name:<17}: first render {render:6.2f} s · endpoint {endpoint:6.2f} s (best of 3)"
                f" · floor, its SQL alone in DuckDB {floor:6.2f} s"
            )


if __name__ == "__main__":
    main()
