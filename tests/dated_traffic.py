"""Rollout traffic (tests/rollout_traffic.py) stored as if received some days ago: the collector's own
flatteners, given an earlier receive time, feed a real store. What the archive and retention act on."""

import json
import time
from datetime import UTC, datetime, timedelta

import polars as pl
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from rollout_traffic import rollout_requests

from otel_rl.collector.flatten import logs_to_tables, traces_to_tables
from otel_rl.collector.metrics import metrics_to_tables
from otel_rl.store import Store

# Columns numbered by each store for itself (its commits, its log records' arrival): they differ between
# stores holding the same data, and say nothing about it.
STORE_NUMBERING = {"commit_seq", "seq"}


def rows(frame: pl.DataFrame) -> list[str]:
    """The frame's rows as sorted JSON lines, without the columns each store numbers for itself."""
    frame = frame.drop([name for name in frame.columns if name in STORE_NUMBERING])
    return sorted(json.dumps(row, sort_keys=True, default=str) for row in frame.to_dicts())


def days_ago(days: int) -> datetime:
    return datetime.now(UTC) - timedelta(days=days)


def traffic(rollout_ids: list[str]) -> dict[str, list[Message]]:
    """Each rollout's requests, made once (ids are random): its spans (gateway calls with tokens, and the
    client spans around them for every other rollout) and its outcome reward, one group for all."""
    start = time.time_ns()
    return {
        rollout_id: rollout_requests(rollout_id, start + index * 10**9, with_client=index % 2 == 0)
        for index, rollout_id in enumerate(rollout_ids)
    }


def gauge_request(name: str, value: float) -> ExportMetricsServiceRequest:
    """One gauge data point (what a harness's metrics exporter sends)."""
    request = ExportMetricsServiceRequest()
    metric = request.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name = name
    point = metric.gauge.data_points.add()
    point.time_unix_nano, point.as_double = 1_700_000_000 * 10**9, value
    return request


def store_requests(store: Store, requests: list[Message], received_at: datetime) -> None:
    """The requests stored as received at `received_at`, one commit each, then normalized."""
    for request in requests:
        if isinstance(request, ExportTraceServiceRequest):
            batch = traces_to_tables(request, received_at, "admin")
        elif isinstance(request, ExportLogsServiceRequest):
            logs = [scoped.log_records for outer in request.resource_logs for scoped in outer.scope_logs]
            batch = logs_to_tables(request, received_at, store.reserve_log_seqs(sum(map(len, logs))), "admin")
        else:
            batch = metrics_to_tables(request, received_at, "admin")
        store.submit(batch).result()
    store.wait_normalized()
