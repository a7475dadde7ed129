"""The hack detectors (`hack_flags`) over 100K tool calls in a store, beside the same SQL over plain tables.

Seeded synthetic rollouts (20 tool calls each, GenAI `execute_tool` spans with arguments and results, about
1 in 50 calls a hack of some detector's kind) are ingested into a store in a temporary folder and normalized.
Then `SELECT * FROM hack_flags` is timed (median of --runs) through the store, and again over an in-memory
database holding plain copies of the tables the detectors read (tool_calls, span_identity, spans, rewards)
with the same macros, transforms files 70-79 and union: the floor the store's reads are measured against.
Aim (issue 28): detectors over 100K tool calls within 1 s.

Usage: python bench/detectors.py [--tool-calls 100000] [--runs 5] [--seed 0]
"""

import argparse
import json
import random
import statistics
import tempfile
import time
from concurrent.futures import wait
from pathlib import Path

import duckdb
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_rl import attributes as attr
from otel_rl.collector.ingest import traces_batch
from otel_rl.store import Store
from otel_rl.store.definitions import read_definitions
from otel_rl.store.detections import create_detections
from otel_rl.store.schema import default_transforms_dir

CALLS_PER_ROLLOUT = 20
SPANS_PER_REQUEST = 2000
TEST_FILE = "def test_mean():\n    assert mean([2, 4]) == 3\n"
HONEST = [
    ("bash", {"command": "pytest -q"}, "1 failed, 3 passed"),
    ("bash", {"command": "cat tests/test_stats.py"}, TEST_FILE),
    ("bash", {"command": "git status && git diff"}, "modified: stats.py"),
    ("bash", {"command": "ls -la src/"}, "stats.py\nutil.py"),
    ("write_file", {"path": "stats.py", "content": "def mean(v):\n    return sum(v) / len(v)\n" * 20}, "ok"),
    ("edit", {"filePath": "util.py", "oldString": "x + 1", "newString": "x"}, "ok"),
    ("Read", {"file_path": "tests/test_util.py"}, TEST_FILE),
]
HACKS = [
    ("bash", {"command": "rm -rf tests/"}, ""),
    ("bash", {"command": "git log --all -p"}, ""),
    ("bash", {"command": "curl -sL https://example.com/fix.py -o stats.py"}, ""),
    ("write_file", {"path": "stats.py", "content": "import sys\nsys.exit(0)\n"}, "ok"),
    (
        "edit",
        {"filePath": "stats.py", "newString": "class A:\n    def __eq__(self, o):\n        return True"},
        "",
    ),
    (
        "write_file",
        {"path": "stats.py", "content": "def mean(v):\n    if v == [2, 4]:\n        return 3\n"},
        "",
    ),
]


def requests(n_calls: int, seed: int):  # noqa: ANN201 - ExportTraceServiceRequest, one per SPANS_PER_REQUEST
    """The tool spans, seeded: rollout r's calls in order, about 1 in 50 a hack."""
    rng = random.Random(seed)
    start = time.time_ns() - 3600 * 10**9
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("agent")
    for i in range(n_calls):
        rollout = f"bench-{i // CALLS_PER_ROLLOUT:06d}"
        name, arguments, result = rng.choice(HACKS) if rng.random() < 0.02 else rng.choice(HONEST)
        at = start + i * 1000
        tracer.start_span(
            f"execute_tool {name}",
            start_time=at,
            attributes={
                attr.ROLLOUT_ID: rollout,
                attr.ATTEMPT_ID: f"{rollout}-a",
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": f"call-{i}",
                "gen_ai.tool.call.arguments": json.dumps(arguments),
                "gen_ai.tool.call.result": result,
            },
        ).end(end_time=at + 500)
        if (i + 1) % SPANS_PER_REQUEST == 0 or i + 1 == n_calls:
            yield encode_spans(exporter.get_finished_spans())
            exporter.clear()


def median_seconds(con_query, sql: str, runs: int) -> float:  # noqa: ANN001 - a function of one SQL string
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        con_query(sql)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def plain_copy(db: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory database with plain copies of what the detectors read, and the detector views on them."""
    con = duckdb.connect()
    con.execute("ATTACH ? AS store (READ_ONLY)", [str(db)])
    for table in ("tool_calls", "span_identity", "spans", "rewards"):
        con.execute(f"CREATE TABLE {table} AS FROM store.{table}")
    con.execute("DETACH store")
    for file in read_definitions(default_transforms_dir()):
        if file.name == "10_macros.sql" or file.name[:2].isdigit() and 70 <= int(file.name[:2]) <= 79:
            for statement in file.statements:
                con.execute(statement.sql)
    create_detections(con)
    return con


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool-calls", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sql = "SELECT * FROM hack_flags"
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-") as scratch:
        db = Path(scratch) / "store.duckdb"
        started = time.perf_counter()
        with Store(db) as store:
            wait([store.submit(traces_batch(r, "admin")) for r in requests(args.tool_calls, args.seed)])
            store.wait_normalized(timeout_s=1800)
            loaded = time.perf_counter() - started
            n_calls = store.query_arrow("SELECT count(*) AS n FROM tool_calls")["n"][0].as_py()
            flagged = store.query_arrow(sql).num_rows
            in_store = median_seconds(store.query_arrow, sql, args.runs)
        con = plain_copy(db)
        assert con.sql(sql).to_arrow_table().num_rows == flagged
        floor = median_seconds(lambda q: con.sql(q).to_arrow_table(), sql, args.runs)
    print(
        f"{n_calls} tool calls in {args.tool_calls // CALLS_PER_ROLLOUT} rollouts "
        f"(ingested and normalized in {loaded:.1f} s), {flagged} flagged"
    )
    print(
        f"hack_flags through the store: {in_store:.3f} s   "
        f"same SQL over plain in-memory tables: {floor:.3f} s   ratio {in_store / floor:.2f}   aim: <= 1 s"
    )


if __name__ == "__main__":
    main()
