"""OTLP export requests to raw-table rows (flattened here, in the collector), and into a store durably."""

from datetime import UTC, datetime

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_rl.collector import flatten, metrics
from otel_rl.store import IngestResult, Store
from otel_rl.store.identity import NO_IDENTITY, Identity
from otel_rl.store.layout import SENDER_SERVER, Sender
from otel_rl.store.writer import Batch


def traces_batch(request: ExportTraceServiceRequest, sender: Sender, key: Identity = NO_IDENTITY) -> Batch:
    """The raw-table rows of an ExportTraceServiceRequest from `sender` (with rollout key `key`)."""
    return flatten.traces_to_tables(request, _now(), sender, key)


def logs_batch(
    store: Store, request: ExportLogsServiceRequest, sender: Sender, key: Identity = NO_IDENTITY
) -> Batch:
    """The raw-table rows of an ExportLogsServiceRequest from `sender` (with rollout key `key`), numbered in
    the store's arrival order."""
    n_records = sum(len(sl.log_records) for rl in request.resource_logs for sl in rl.scope_logs)
    return flatten.logs_to_tables(request, _now(), store.reserve_log_seqs(n_records), sender, key)


def metrics_batch(request: ExportMetricsServiceRequest, sender: Sender, key: Identity = NO_IDENTITY) -> Batch:
    """The raw-table rows of an ExportMetricsServiceRequest from `sender` (with rollout key `key`)."""
    return metrics.metrics_to_tables(request, _now(), sender, key)


# The server's own records, written in its process (the gateway's tracer): its components vouch for them.


def ingest_traces(store: Store, request: ExportTraceServiceRequest) -> IngestResult:
    """Store the server's own ExportTraceServiceRequest durably (blocks until committed, waits while
    saturated)."""
    return store.write(traces_batch(request, SENDER_SERVER), "spans")


def ingest_logs(store: Store, request: ExportLogsServiceRequest) -> IngestResult:
    """Store the server's own ExportLogsServiceRequest durably (blocks until committed)."""
    return store.write(logs_batch(store, request, SENDER_SERVER), "logs")


def ingest_metrics(store: Store, request: ExportMetricsServiceRequest) -> IngestResult:
    """Store the server's own ExportMetricsServiceRequest durably (blocks until committed)."""
    return store.write(metrics_batch(request, SENDER_SERVER), "metric_points")


def _now() -> datetime:
    return datetime.now(UTC)
