"""The collector's Prometheus metrics: exports by outcome, records stored or refused, bytes, batch sizes."""

from collections import Counter as Tally
from collections.abc import Callable, Iterator
from typing import Literal

import pyarrow as pa
from prometheus_client import Counter, Histogram
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from otel_rl.attributes import EVALUATION_SCORE_VALUE
from otel_rl.auth import Unauthorized
from otel_rl.collector.decode import DecodeError, Signal, UnsupportedContentType
from otel_rl.collector.export import PreparedExport
from otel_rl.http_body import BodyTooLarge
from otel_rl.store import Saturated
from otel_rl.store.writer import StoreUnavailable

Transport = Literal["http", "grpc"]
MAIN_TABLE: dict[Signal, str] = {"traces": "spans", "logs": "logs", "metrics": "metric_points"}
# Why a whole export was refused, by its error's type (checked in order: StoreClosed is a StoreUnavailable).
_REFUSALS: tuple[tuple[type[Exception], str], ...] = (
    (Unauthorized, "unauthorized"),
    (UnsupportedContentType, "unsupported_content_type"),
    (BodyTooLarge, "too_large"),
    (DecodeError, "invalid"),
    (Saturated, "saturated"),
    (StoreUnavailable, "store_unavailable"),
)
BATCH_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)
EXPORT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


def refusal_reason(error: Exception) -> str:
    """A low-cardinality name for why an export was refused (the error's text goes to its sender only)."""
    return next((reason for kind, reason in _REFUSALS if isinstance(error, kind)), "internal")


def rejection_reason(reason: str) -> str:
    """The kind of a record's refusal (export.refuse_records): a non-finite reward, or an identity a rollout
    key may not give. The full reason quotes what the sender wrote: never a label value."""
    return (
        "reward_not_finite" if f"{EVALUATION_SCORE_VALUE} must be a finite number" in reason else "identity"
    )


class IngestMetrics(Collector):
    """Counts what the OTLP receivers (HTTP and gRPC) stored and refused; hands each export's stored spans to
    `on_spans` (the server's training metrics read the trainer's step records from them)."""

    def __init__(self, on_spans: Callable[[pa.Table], None]) -> None:
        self.on_spans = on_spans
        self.exports = Counter(
            "otel_rl_collector_exports",
            "OTLP exports by signal, transport and outcome (ok, or why the whole export was refused).",
            ["signal", "transport", "outcome"],
            registry=None,
        )
        self.records = Counter(
            "otel_rl_collector_records",
            "Spans, log records and data points stored (accepted) or refused (rejected) by reason.",
            ["signal", "outcome", "reason"],
            registry=None,
        )
        self.received_bytes = Counter(
            "otel_rl_collector_received_bytes",
            "Bytes of OTLP request bodies received, as sent (compressed or not).",
            ["signal", "transport"],
            registry=None,
        )
        self.batch_records = Histogram(
            "otel_rl_collector_export_records",
            "Records (spans, log records, data points) per stored export.",
            ["signal"],
            buckets=BATCH_BUCKETS,
            registry=None,
        )
        self.export_seconds = Histogram(
            "otel_rl_collector_export_duration_seconds",
            "Time from receiving an export to its rows being durable in the store.",
            ["signal", "transport"],
            buckets=EXPORT_BUCKETS_S,
            registry=None,
        )

    def stored(
        self,
        signal: Signal,
        transport: Transport,
        prepared: PreparedExport,
        *,
        body_bytes: int,
        seconds: float,
    ) -> None:
        """An export whose rows are durable (some of its records may have been refused)."""
        self.exports.labels(signal, transport, "ok").inc()
        self.received_bytes.labels(signal, transport).inc(body_bytes)
        self.export_seconds.labels(signal, transport).observe(seconds)
        main = prepared.batch.get(MAIN_TABLE[signal])
        accepted = main.num_rows if main is not None else 0
        self.records.labels(signal, "accepted", "").inc(accepted)
        self.batch_records.labels(signal).observe(accepted)
        kinds: Tally[str] = Tally()
        for reason, count in prepared.refused.items():
            kinds[rejection_reason(reason)] += count
        for kind, count in kinds.items():
            self.records.labels(signal, "rejected", kind).inc(count)
        if main is not None and signal == "traces":
            self.on_spans(main)

    def refused(self, signal: Signal, transport: Transport, error: Exception, *, body_bytes: int) -> None:
        """An export refused as a whole (nothing of it stored)."""
        self.exports.labels(signal, transport, refusal_reason(error)).inc()
        self.received_bytes.labels(signal, transport).inc(body_bytes)

    def collect(self) -> Iterator[Metric]:
        for metric in (
            self.exports,
            self.records,
            self.received_bytes,
            self.batch_records,
            self.export_seconds,
        ):
            yield from metric.collect()
