"""The gateway's own tracer (reload spans): spans are encoded to OTLP and handed to the store in-process."""

import logging
from collections.abc import Callable, Sequence

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

log = logging.getLogger(__name__)

SERVICE_NAME = "otel-rl-gateway"
# A call with n choices carries 2n + ~30 attributes; the SDK's default limit (128) would drop choices.
MAX_SPAN_ATTRIBUTES = 100_000
MAX_QUEUED_SPANS = 65_536

Ingest = Callable[[ExportTraceServiceRequest], object]


class StoreSpanExporter(SpanExporter):
    """Encodes finished spans to an ExportTraceServiceRequest and ingests it durably."""

    def __init__(self, ingest: Ingest) -> None:
        self._ingest = ingest

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            self._ingest(encode_spans(spans))
        except Exception:  # the exporter thread must survive a store error; the spans are lost, loudly
            log.exception("the store refused %d gateway spans", len(spans))
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def gateway_tracer_provider(
    ingest: Ingest, *, flush_ms: int, forward: SpanProcessor | None = None
) -> TracerProvider:
    """A TracerProvider of the gateway's own (not the global one) that records every span it makes.

    Always sampled: a caller's unsampled `traceparent` must not drop training data. The gateway writes its
    call spans as rows directly (span_rows.py); this provider records its reload spans.
    `forward`: also hand every span to this processor (an OTLP exporter's, see `otlp_forwarder`).
    """
    provider = TracerProvider(
        resource=Resource.create({"service.name": SERVICE_NAME}),
        sampler=ALWAYS_ON,
        span_limits=SpanLimits(max_span_attributes=MAX_SPAN_ATTRIBUTES),
    )
    provider.add_span_processor(
        BatchSpanProcessor(
            StoreSpanExporter(ingest),
            max_queue_size=MAX_QUEUED_SPANS,
            schedule_delay_millis=flush_ms,
            max_export_batch_size=1024,
        )
    )
    if forward is not None:
        provider.add_span_processor(forward)
    return provider


def otlp_forwarder(endpoint: str) -> SpanProcessor:
    """A batching processor exporting spans to an OTLP/HTTP traces endpoint (`--forward-otlp`)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint), max_queue_size=MAX_QUEUED_SPANS)
