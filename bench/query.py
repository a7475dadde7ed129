"""Typical queries over a store filled through the real ingest path (at 1M and 10M calls by default), against
DuckDB scanning plain tables of the same rows in the same run.

The fill: OTLP trace requests of bench/ingest.py's shape (512 captured GenAI fixture spans of every dialect,
8 traces), each trace one rollout of a GRPO group of 8 (the request's): every span carries the rollout
identity as span attributes (as the SDK's baggage copies it), and each trace also has the controller's
`otel_rl.rollout` span and one gateway call span with exact token ids. Three groups in four get an outcome
reward (a grader's `gen_ai.evaluation.result` log record, collector/rewards.py's reward_log_request). Each
request is parsed, flattened by collector.ingest.traces_batch and written with Store.submit while the store's
normalizer keeps its tables caught up, as in `otel-rl serve` (without HTTP: bench/ingest.py times that).

Queries run through Store.query_arrow (the sandbox /v1/query uses, one DuckDB thread) on the filled store,
best of --repeats; the limit runs the same statements over plain tables (CREATE TABLE AS of llm_calls,
rollouts and rewards in a scratch DuckDB file, one thread). Figures are wall seconds on a shared machine:
the load average is printed beside them. The fixtures repeat (71 distinct spans), so DuckDB compresses
their content far better than real traffic's: bytes per call are a floor.

Run: .venv/bin/python bench/query.py [--calls 1000000 --calls 10000000] [--keep DIR] [--repeats 5]
     .venv/bin/python bench/query.py --calls 50000            # a quick run
With --keep DIR the stores stay in DIR (calls-N.duckdb): a second run reuses them (or resumes a fill that
was stopped, or grows the largest smaller one), and skips what is already there.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
from ingest import SPANS_PER_REQUEST, TRACES_PER_REQUEST, fixture_spans, fresh_copy, request_template
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from otel_rl import attributes as attr
from otel_rl.collector.ingest import logs_batch, traces_batch
from otel_rl.collector.rewards import RewardIn, reward_log_request
from otel_rl.store import Saturated, Store, reads
from otel_rl.store.connection import CATALOG, connect
from otel_rl.store.layout import RAW_TABLES
from otel_rl.store.normalizer import NotNormalized
from otel_rl.store.sandbox import Params
from otel_rl.train.groups import read_groups

console = Console(width=None if sys.stdout.isatty() else 150)
GROUP_BY = "SELECT request_model, count(*) FROM llm_calls GROUP BY 1"
BY_REWARD = "SELECT * FROM rollouts ORDER BY outcome_reward DESC NULLS LAST, rollout_id LIMIT 100"
ROLLOUT_CALLS = "SELECT * FROM llm_calls WHERE rollout_id = '{rollout_id}' ORDER BY start_time_unix_nano"
AIM_GROUP_BY_S_PER_M = 0.3  # the aims: 0.3 s over 1M calls, 3 s over 10M (linear in between)
STEP_INDEPENDENT = 1.5  # the step's read at the largest size within this factor of it at the smallest
STEP_GROUPS = 8  # an online step's groups: the last 8 requests'
IN_FLIGHT = 8  # submitted requests not yet committed (the server's concurrent exports)
REWARDED = 3  # of every 4 groups
# characters of an identity placeholder: a rollout id is "r" + 10-digit request + "-" + 4-digit trace
IDS = 15
PLAIN = ("llm_calls", "rollouts", "rewards")


def load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


# ---------------------------------------------------------------- the traffic


@dataclass(frozen=True)
class RolloutTemplate:
    """bench/ingest.py's request with rollout identity, a controller span and a gateway call per trace, and
    the placeholders a copy replaces: fresh_copy's, each trace's rollout mark, the group's, and the times of
    the controller's and the gateway's spans."""

    body: bytes
    placeholders: list[bytes]
    rollouts: list[bytes]
    group: bytes
    times: list[bytes]  # controller start, end; gateway start, end (fixed64, little-endian)


def _kv(key: str, value: str | int | bytes) -> KeyValue:
    if isinstance(value, bytes):
        return KeyValue(key=key, value=AnyValue(bytes_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def rollout_template() -> RolloutTemplate:
    body, placeholders = request_template(fixture_spans())
    request = ExportTraceServiceRequest.FromString(body)
    trace_ids = placeholders[:TRACES_PER_REQUEST]
    rollouts = [os.urandom(8).hex()[:IDS] for _ in trace_ids]
    group = os.urandom(8).hex()[:IDS]
    times = [os.urandom(8) for _ in range(4)]
    c0, c1, g0, g1 = (int.from_bytes(t, "little") for t in times)

    def identity(trace: int) -> list[KeyValue]:
        return [
            _kv(attr.ROLLOUT_ID, "r" + rollouts[trace]),
            _kv(attr.ATTEMPT_ID, "a" + rollouts[trace]),
            _kv(attr.GROUP_ID, "g" + group),
            _kv(attr.TASK_ID, "t" + group),
            _kv(attr.SPLIT, "train"),
        ]

    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                span.attributes.extend(identity(trace_ids.index(span.trace_id)))
    rng = np.random.default_rng(0)
    controller = request.resource_spans.add()
    controller.resource.attributes.append(_kv("service.name", "otel-rl-controller"))
    controller_spans = controller.scope_spans.add()
    controller_spans.scope.name = attr.CONTROLLER_SCOPE
    gateway = request.resource_spans.add()
    gateway.resource.attributes.append(_kv("service.name", "otel-rl"))
    gateway_spans = gateway.scope_spans.add()
    gateway_spans.scope.name = attr.GATEWAY_SCOPE
    for trace, trace_id in enumerate(trace_ids):
        root = (SPANS_PER_REQUEST + trace).to_bytes(8, "big")
        controller_spans.spans.append(
            Span(
                trace_id=trace_id,
                span_id=root,
                name=attr.ROLLOUT_SPAN_NAME,
                kind=Span.SPAN_KIND_INTERNAL,
                start_time_unix_nano=c0,
                end_time_unix_nano=c1,
                attributes=[*identity(trace), _kv(attr.ROLLOUT_STATUS, "ok"), _kv(attr.ROLLOUT_EXIT_CODE, 0)],
            )
        )
        prompt = rng.integers(10, 30000, 512, dtype="<i4")
        answer = rng.integers(10, 30000, 128, dtype="<i4")
        gateway_spans.spans.append(  # after the harness's client calls (not containing it: not superseded)
            Span(
                trace_id=trace_id,
                span_id=(SPANS_PER_REQUEST + TRACES_PER_REQUEST + trace).to_bytes(8, "big"),
                parent_span_id=root,
                name="chat tiny",
                kind=Span.SPAN_KIND_CLIENT,
                start_time_unix_nano=g0,
                end_time_unix_nano=g1,
                attributes=[
                    *identity(trace),
                    _kv("gen_ai.operation.name", "chat"),
                    _kv("gen_ai.provider.name", "vllm"),
                    _kv("gen_ai.request.model", "tiny"),
                    _kv("gen_ai.response.model", "tiny"),
                    _kv("gen_ai.usage.input_tokens", prompt.size),
                    _kv("gen_ai.usage.output_tokens", answer.size),
                    _kv(attr.POLICY_VERSION, 1),
                    _kv(attr.PROMPT_TOKEN_IDS, prompt.tobytes()),
                    _kv(attr.CHOICE_TOKEN_IDS.format(i=0), answer.tobytes()),
                    _kv(attr.CHOICE_LOGPROBS.format(i=0), (-rng.random(answer.size)).astype("<f4").tobytes()),
                ],
            )
        )
    return RolloutTemplate(
        request.SerializeToString(),
        placeholders,
        [r.encode() for r in rollouts],
        group.encode(),
        times,
    )


def rollout_id(request: int, trace: int) -> str:
    return f"r{request:010d}-{trace:04d}"


def group_id(request: int) -> str:
    return f"g{request:0{IDS}d}"


def rollout_copy(template: RolloutTemplate, request: int) -> bytes:
    """Request number `request`: fresh trace ids and times (fresh_copy), its rollouts and group."""
    body = fresh_copy(template.body, template.placeholders)
    for trace, mark in enumerate(template.rollouts):
        body = body.replace(mark, rollout_id(request, trace)[1:].encode())
    body = body.replace(template.group, group_id(request)[1:].encode())
    now = time.time_ns()
    offsets = (
        -5_000_000,
        50_000_000,
        20_000_000,
        30_000_000,
    )  # controller around all; gateway after the calls
    for placeholder, offset in zip(template.times, offsets, strict=True):
        body = body.replace(placeholder, (now + offset).to_bytes(8, "little"))
    return body


def rewards_request(request: int) -> ExportLogsServiceRequest | None:
    """The group's outcome rewards as a grader sends them (none for one group in four)."""
    if request % 4 >= REWARDED:
        return None
    logs = ExportLogsServiceRequest()
    now = time.time_ns()
    for trace in range(TRACES_PER_REQUEST):
        value = float((request * TRACES_PER_REQUEST + trace) * 2654435761 % 7 < 3)
        logs.MergeFrom(
            reward_log_request(RewardIn(rollout_id=rollout_id(request, trace), value=value), now_ns=now)
        )
    return logs


# ---------------------------------------------------------------- the fill


@dataclass
class Fill:
    requests: int  # filled in this run
    spans: int
    seconds: float  # until the last commit
    catch_up: float  # from the last commit until the normalized tables had it
    lag_commits: int  # when the last commit was made


def submit(store: Store, batch: dict) -> Future:
    while True:
        try:
            return store.submit(batch)
        except Saturated:
            time.sleep(0.01)


def requests_done(store: Store) -> int:
    """Requests stored (their controller spans name the group: the request's number)."""
    sql = f"SELECT max(group_id) FROM spans WHERE scope_name = '{attr.CONTROLLER_SCOPE}'"
    last = store.query_arrow(sql).column(0)[0].as_py()
    return 0 if last is None else int(last[1:]) + 1


def calls_stored(store: Store) -> int:
    return store.query_arrow("SELECT count(*) FROM llm_calls").column(0)[0].as_py()


def fill(store: Store, template: RolloutTemplate, first: int, last: int, calls_per_request: float) -> Fill:
    """Ingest requests first..last-1 as fast as the store takes them, then wait for the normalizer."""
    pending: deque[Future] = deque()
    spans_per_request = SPANS_PER_REQUEST + 2 * TRACES_PER_REQUEST
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[status]}"))
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        ingest = progress.add_task("ingest", total=last - first, status="")
        normalized = progress.add_task("normalized", total=1, status="")

        def show(done: int) -> None:
            calls = done * calls_per_request
            progress.update(ingest, completed=done, status=f"{calls:,.0f} calls, {load()}")
            through, committed = store.normalizer.through, store.writer.last_commit_seq
            progress.update(
                normalized, completed=through, total=max(committed, 1), status=f"lag {committed - through}"
            )

        start = time.perf_counter()
        for request in range(first, last):
            body = rollout_copy(template, request)
            pending.append(submit(store, traces_batch(ExportTraceServiceRequest.FromString(body), "admin")))
            rewards = rewards_request(request)
            if rewards is not None:
                pending.append(submit(store, logs_batch(store, rewards, "admin")))
            while len(pending) > IN_FLIGHT:
                pending.popleft().result()
            if request % 16 == 0:
                show(request - first)
        while pending:
            pending.popleft().result()
        ingested = time.perf_counter()
        lag = store.normalizer.lag
        show(last - first)
        while True:
            try:
                store.wait_normalized(timeout_s=0.5)
                break
            except NotNormalized:
                if store.normalizer.failure:
                    console.print(f"[red]normalizing fails: {store.normalizer.failure}")
                show(last - first)
        show(last - first)
        caught_up = time.perf_counter()
    return Fill(last - first, (last - first) * spans_per_request, ingested - start, caught_up - ingested, lag)


def filled_store(keep: Path, calls: int, template: RolloutTemplate) -> tuple[Path, Fill | None]:
    """keep/calls-N.duckdb with at least `calls` llm_calls: reused, resumed, or grown from a smaller one."""
    path = keep / f"calls-{calls}.duckdb"
    if not path.exists():
        smaller = sorted(
            (int(p.stem.split("-")[1]), p)
            for p in keep.glob("calls-*.duckdb")
            if int(p.stem.split("-")[1]) < calls
        )
        if smaller and not Path(f"{smaller[-1][1]}.wal").exists():
            console.print(f"growing a copy of {smaller[-1][1].name}")
            shutil.copyfile(smaller[-1][1], path)
    with Store(path) as store:
        store.wait_normalized()
        first = requests_done(store)
        if first == 0:  # the first request tells how many calls each makes
            fill(store, template, 0, 1, 0)
            first = 1
        per_request = calls_stored(store) / first
        last = max(first, math.ceil(calls / per_request))
        if last == first:
            console.print(f"{path.name}: {calls_stored(store):,} calls stored, no fill")
            return path, None
        verb = "resuming" if first > 1 else "filling"
        console.print(
            f"{verb} {path.name}: requests {first:,}-{last - 1:,} ({per_request:.1f} calls each), {load()}"
        )
        done = fill(store, template, first, last, per_request)
    return path, done


# ---------------------------------------------------------------- sizes


def storage(path: Path) -> dict[str, float]:
    """Bytes of each table of the closed store (its blocks as pragma_storage_info lists them; a block shared
    by several tables is split between them), and the file's free blocks."""
    con = connect(path, read_only=True)
    try:
        (block_size, free_blocks) = con.execute(
            f"SELECT block_size, free_blocks FROM pragma_database_size() WHERE database_name = '{CATALOG}'"
        ).fetchall()[0]
        tables = con.execute(
            f"SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = '{CATALOG}'"
        ).fetchall()
        blocks: dict[int, set[str]] = {}
        for schema, table in tables:
            rows = con.execute(
                f"SELECT block_id, additional_block_ids FROM pragma_storage_info('{schema}.{table}')"
                " WHERE persistent AND block_id >= 0"
            ).fetchall()
            for block, more in rows:
                for b in (block, *(more or ())):
                    blocks.setdefault(b, set()).add(f"{schema}.{table}")
    finally:
        con.close()
    sizes: dict[str, float] = {}
    for owners in blocks.values():
        for owner in owners:
            sizes[owner] = sizes.get(owner, 0) + block_size / len(owners)
    sizes["(free blocks)"] = free_blocks * block_size
    return sizes


def plain_copy(path: Path, plain: Path) -> float:
    """The user-facing tables' rows (PLAIN) as plain tables in a new DuckDB file; seconds it took."""
    plain.unlink(missing_ok=True)
    start = time.perf_counter()
    con = duckdb.connect(str(plain))
    try:
        con.execute(f"ATTACH '{path}' AS {CATALOG} (READ_ONLY)")
        for table in PLAIN:
            con.execute(f"CREATE TABLE main.{table} AS SELECT * FROM {CATALOG}.main.{table}")
        con.execute("CHECKPOINT")
    finally:
        con.close()
    return time.perf_counter() - start


# ---------------------------------------------------------------- queries


def best_of(repeats: int, run: Callable[[], object]) -> float:
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


@dataclass
class StepRead:
    seconds: dict[str, float]  # best of the whole read and of each statement
    rows: dict[str, int]
    statements: dict[str, tuple[str, Params | None]]  # as sent: SQL and its bound values


def step_read(query: reads.Run, groups: list[str], repeats: int) -> StepRead:
    """read_groups as an online step sends it (bounded by its final attempts' start, which the loop knows),
    best of `repeats`, and each of its statements apart; and its attempts statement unbounded, as a resumed
    run's first step sends it for groups found finished in the store."""
    sent: list[tuple[str, Params | None]] = []

    def recording(sql: str, params: Params | None = None) -> pl.DataFrame:
        sent.append((sql, params))
        return query(sql, params)

    started = int(reads.final_attempts(query, groups)["attempt_start_ns"].min())
    calls, rollouts, rewards = read_groups(recording, groups, started)
    statements = dict(zip(("attempts", "calls", "rewards"), sent, strict=True))
    seconds = {"read_groups": best_of(repeats, lambda: read_groups(query, groups, started))}
    seconds |= {name: best_of(repeats, lambda sent=sent: query(*sent)) for name, sent in statements.items()}
    seconds["attempts, unbounded"] = best_of(repeats, lambda: reads.final_attempts(query, groups))
    rows = {"calls": calls.height, "rollouts": rollouts.height, "rewards": rewards.height}
    return StepRead(seconds, rows, statements)


@dataclass
class Timings:
    store: dict[str, float]
    plain: dict[str, float]
    step: StepRead
    plain_step: dict[str, float]
    load: str


def timed_queries(path: Path, plain: Path, requests: int, repeats: int) -> Timings:
    middle = rollout_id(requests // 2, 3)
    groups = [group_id(r) for r in range(requests - STEP_GROUPS, requests)]
    statements = {
        "SELECT 1 (the sandbox's own cost)": "SELECT 1",
        "group by model": GROUP_BY,
        "rollouts by reward": BY_REWARD,
        "one rollout's calls": ROLLOUT_CALLS.format(rollout_id=middle),
    }
    load_before = load()
    with Store(path) as store:

        def query(sql: str, params: Params | None = None) -> pl.DataFrame:
            return pl.from_arrow(store.query_arrow(sql, params))

        timed = {
            name: best_of(repeats, lambda sql=sql: store.query_arrow(sql)) for name, sql in statements.items()
        }
        step = step_read(query, groups, repeats)
    con = connect(plain, read_only=True)  # one DuckDB thread, as the store's
    try:

        def plain_best(sql: str, params: Params | None = None) -> float:
            return best_of(repeats, lambda: con.execute(sql, params).to_arrow_table())

        plain_timed = {name: plain_best(sql) for name, sql in statements.items()}
        plain_step = {name: plain_best(*step.statements[name]) for name in ("calls", "rewards")}
    finally:
        con.close()
    return Timings(timed, plain_timed, step, plain_step, f"{load_before} -> {load()}")


# ---------------------------------------------------------------- the report


def report(calls: int, path: Path, done: Fill | None, sizes: dict[str, float], timings: Timings) -> None:
    file_bytes = path.stat().st_size
    stored = _count(path)
    console.print(
        f"\n[bold]{stored['llm_calls']:,} calls[/] ({stored['spans']:,} spans, {stored['logs']:,} log"
        f" records, {stored['rollouts']:,} rollouts, {stored['rewards']:,} rewards) in {path.name}"
    )
    if done:
        rate = done.spans / done.seconds
        console.print(
            f"  fill (this run)        : {done.requests:,} requests, {done.spans:,} spans in"
            f" {done.seconds:,.0f} s = {rate:,.0f} spans/s ingested; the normalizer {done.lag_commits:,}"
            " commits behind at the last commit,"
            f" caught up {done.catch_up:,.0f} s later"
            f" ({done.spans / (done.seconds + done.catch_up):,.0f} spans/s normalized overall)"
        )
    else:
        console.print("  fill                   : reused from --keep (no fill this run)")
    raw = sum(sizes.get(f"main.{layout.table}", 0) for layout in RAW_TABLES)
    normalized = sum(v for k, v in sizes.items() if k.startswith("normalized."))
    free = sizes["(free blocks)"]
    per_call = stored["llm_calls"] or 1
    console.print(
        f"  store size             : {file_bytes / per_call:,.0f} bytes per call"
        f" ({file_bytes / 2**30:.2f} GiB): raw tables {raw / per_call:,.0f}, normalized tables"
        f" {normalized / per_call:,.0f}, free blocks {free / per_call:,.0f}, the rest"
        f" {(file_bytes - raw - normalized - free) / per_call:,.0f} (the store's own tables, metadata)"
    )
    largest = sorted(((v, k) for k, v in sizes.items() if k.startswith("normalized.")), reverse=True)[:4]
    console.print(
        "    largest normalized   : " + ", ".join(f"{k[11:]} {v / per_call:,.0f}" for v, k in largest)
    )
    table = Table(title=f"best of N, wall s, {timings.load}")
    for column in ("query", "store (sandbox)", "plain table (limit)", "store / plain", "aim"):
        table.add_column(column, justify="left" if column in ("query", "aim") else "right")
    aim = AIM_GROUP_BY_S_PER_M * calls / 1e6
    for name, seconds in timings.store.items():
        plain = timings.plain[name]
        verdict = ""
        if name == "group by model" and calls >= 1_000_000:
            scaled = "" if calls in (1_000_000, 10_000_000) else f" ({AIM_GROUP_BY_S_PER_M} s per 1M calls)"
            verdict = f"< {aim:.3g} s{scaled}: {'met' if seconds < aim else 'MISSED'}"
        elif name == "group by model":
            verdict = "(aims at 1M and 10M calls)"
        table.add_row(name, f"{seconds:.3f}", f"{plain:.3f}", f"{seconds / plain:.1f}x", verdict)
    step = timings.step
    table.add_row(
        f"online step read (read_groups: {step.rows['rollouts']} rollouts, {step.rows['calls']} calls,"
        f" {step.rows['rewards']} rewards)",
        f"{step.seconds['read_groups']:.3f}",
        "",
        "",
        "independent of size (below)",
    )
    labels = {
        "attempts": "  its attempts (controller spans: raw)",
        "calls": "  its calls (llm_calls)",
        "rewards": "  its rewards (rewards)",
        "attempts, unbounded": "  attempts unbounded (a resumed run's first step)",
    }
    for name, label in labels.items():
        plain = timings.plain_step.get(name)
        table.add_row(
            label,
            f"{step.seconds[name]:.3f}",
            f"{plain:.3f}" if plain else "(raw spans)",
            f"{step.seconds[name] / plain:.1f}x" if plain else "",
            "",
        )
    console.print(table)


def _count(path: Path) -> dict[str, int]:
    con = connect(path, read_only=True)
    try:
        names = ("llm_calls", "spans", "logs", "rollouts", "rewards")
        (row,) = con.execute("SELECT " + ", ".join(f"(SELECT count(*) FROM {n})" for n in names)).fetchall()
        return dict(zip(names, row, strict=True))
    finally:
        con.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--calls", type=int, action="append", help="store sizes in llm_calls rows (repeatable)"
    )
    parser.add_argument("--keep", type=Path, help="keep the stores in this folder, and reuse those there")
    parser.add_argument("--repeats", type=int, default=5, help="best of this many runs of each query")
    args = parser.parse_args()
    sizes = sorted(set(args.calls or [1_000_000, 10_000_000]))
    console.print(f"{os.cpu_count()} cores, {load()}")
    template = rollout_template()
    with tempfile.TemporaryDirectory() as tmp:
        keep = args.keep or Path(tmp)
        keep.mkdir(parents=True, exist_ok=True)
        steps: dict[int, dict[str, float]] = {}
        for calls in sizes:
            start = time.perf_counter()
            path, done = filled_store(keep, calls, template)
            with console.status("sizes of the store's tables"), Store(path) as store:
                requests = requests_done(store)
            table_sizes = storage(path)
            with console.status(f"copying {', '.join(PLAIN)} into plain tables"):
                copied = plain_copy(path, Path(tmp) / "plain.duckdb")
            console.print(f"  plain copy of {', '.join(PLAIN)}: {copied:.0f} s")
            with console.status(f"timing the queries, best of {args.repeats}"):
                timings = timed_queries(path, Path(tmp) / "plain.duckdb", requests, args.repeats)
            report(calls, path, done, table_sizes, timings)
            console.print(f"  elapsed for this size    : {time.perf_counter() - start:,.0f} s")
            seconds = timings.step.seconds
            steps[calls] = {"read_groups": seconds["read_groups"]}
            (Path(tmp) / "plain.duckdb").unlink()
    if len(steps) > 1:
        for label, key in (("online step read", "read_groups"),):
            small, large = steps[sizes[0]][key], steps[sizes[-1]][key]
            met = large <= STEP_INDEPENDENT * small
            console.print(
                f"{label}: {small:.3f} s at {sizes[0]:,} calls, {large:.3f} s at {sizes[-1]:,} calls"
                f" ({large / small:.2f}x): aim independent of the store's size (within {STEP_INDEPENDENT}x):"
                f" {'met' if met else 'MISSED'}"
            )


if __name__ == "__main__":
    main()
