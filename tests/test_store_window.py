"""The views over a window of the store answer for the window's rollouts as over the whole store."""

import time

import duckdb
import numpy as np
import polars as pl
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from otel_rl import attributes as attr
from otel_rl.collector.rewards import RewardIn, reward_log_request
from otel_rl.query import sql_list
from otel_rl.store import Store
from otel_rl.store.window import StoreWindow


def rollout(rollout_id: str, group_id: str, start_ns: int) -> ExportTraceServiceRequest:
    """The controller's rollout span and two gateway calls (exact tokens) under it, exported by the SDK."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    identity = {
        attr.ROLLOUT_ID: rollout_id,
        attr.ATTEMPT_ID: f"{rollout_id}-a",
        attr.GROUP_ID: group_id,
        attr.TASK_ID: "task",
        attr.SPLIT: "train",
    }
    root = provider.get_tracer(attr.CONTROLLER_SCOPE).start_span(
        attr.ROLLOUT_SPAN_NAME,
        start_time=start_ns,
        attributes={**identity, attr.ROLLOUT_STATUS: "ok", attr.ROLLOUT_EXIT_CODE: 0},
    )
    gateway = provider.get_tracer(attr.GATEWAY_SCOPE)
    for turn in (1, 2):
        tokens = {
            attr.PROMPT_TOKEN_IDS: np.arange(10 * turn, dtype="<i4").tobytes(),
            attr.CHOICE_TOKEN_IDS.format(i=0): np.arange(5, dtype="<i4").tobytes(),
            attr.CHOICE_LOGPROBS.format(i=0): np.full(5, -0.5, dtype="<f4").tobytes(),
        }
        call = gateway.start_span(
            "chat tiny",
            context=trace.set_span_in_context(root),
            kind=SpanKind.CLIENT,
            start_time=start_ns + turn * 10**6,
            attributes={**identity, "gen_ai.operation.name": "chat", attr.POLICY_VERSION: 3, **tokens},
        )
        call.end(end_time=start_ns + turn * 10**6 + 500_000)
    root.end(end_time=start_ns + 10**9)
    return encode_spans(exporter.get_finished_spans())


def test_the_views_over_a_window_answer_for_its_rollouts_as_over_the_whole_store(tmp_path) -> None:
    with Store(tmp_path / "store.duckdb") as store:

        def run(rollout_id: str, group_id: str) -> None:
            start_ns = time.time_ns()
            store.ingest_traces(rollout(rollout_id, group_id, start_ns))
            reward = RewardIn(rollout_id=rollout_id, value=1.0, source="grader")
            store.ingest_logs(reward_log_request(reward, now_ns=start_ns + 2 * 10**9))

        run("old-1", "g-old")
        since = time.time_ns()  # the new rollouts start after this; the old one's reward is timed after it
        run("new-1", "g-new")
        run("new-2", "g-new")

        def whole(sql: str) -> pl.DataFrame:
            return pl.from_arrow(store.query_arrow(sql))

        window = StoreWindow()
        window.load(whole, since_ns=since)
        new = sql_list(["new-1", "new-2"])
        for sql in (
            "SELECT * FROM gateway_call_tokens WHERE group_id = 'g-new' ORDER BY start_time_unix_nano",
            f"SELECT * FROM rewards WHERE rollout_id IN {new} ORDER BY rollout_id",
            f"SELECT * FROM rollouts WHERE rollout_id IN {new} ORDER BY rollout_id",
        ):
            expected = whole(sql)
            assert expected.height >= 2
            assert window.query(sql).equals(expected), sql
        # What was stored before the window is not in it: the old rollout, its tokens, and its reward,
        # although that reward's time is after the window's start.
        loaded = window.query(
            "SELECT (SELECT list(DISTINCT rollout_id ORDER BY rollout_id) FROM rollouts) AS rollouts,"
            " (SELECT count(*) FROM call_tokens) AS tokens, (SELECT count(*) FROM logs) AS logs"
        )
        assert loaded.row(0) == (["new-1", "new-2"], 4, 2)
        # a later load replaces the rows
        window.load(whole, since_ns=0)
        assert window.query("SELECT count(*) AS n FROM rollouts")["n"].item() == 3


def test_a_store_made_before_call_tokens_had_received_at_gets_it_from_the_spans(tmp_path) -> None:
    db = tmp_path / "store.duckdb"
    with Store(db) as store:
        store.ingest_traces(rollout("r-1", "g-1", time.time_ns()))
    con = duckdb.connect(str(db))
    con.execute("ALTER TABLE call_tokens DROP COLUMN received_at")
    con.close()

    with Store(db) as store:
        filled = store.query_arrow(
            "SELECT count(*) FILTER (t.received_at IS NULL) AS missing,"
            " count(*) FILTER (t.received_at = s.received_at) AS from_spans"
            " FROM call_tokens t JOIN spans s USING (trace_id, span_id)"
        ).to_pylist()
        assert filled == [{"missing": 0, "from_spans": 2}]
        store.ingest_traces(rollout("r-2", "g-1", time.time_ns()))  # and new rows are written with it
        assert store.query_arrow("SELECT count(received_at) AS n FROM call_tokens")["n"][0].as_py() == 4
