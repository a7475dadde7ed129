"""Call spans handed to the collector's flattener as OTLP, in batches: the one write path of every span.

Each call becomes the OTLP span a harness's SDK would export for it (same fields; test_gateway_spans.py
compares both), built as protobuf directly: the SDK's span and its OTLP encoder cost four times as much per
call. A thread hands the batch to `collector.ingest.traces_batch` as the server's own (`sender` server, which
no client can send: a network export is the admin's or a rollout key's) every `flush_ms`, and its rows to the
store's group commit. With `--forward-otlp` the same span (same ids) also goes to the OTLP exporter.
"""

import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common._internal import _encode_attributes, _encode_resource
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope as PB2Scope
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import INVALID_SPAN_CONTEXT, SpanContext, SpanKind, StatusCode, TraceFlags
from opentelemetry.trace import Status as SdkStatus

from otel_rl.attributes import GATEWAY_SCOPE
from otel_rl.collector.ingest import traces_batch
from otel_rl.gateway.recording import CallRecord, call_attributes, span_name
from otel_rl.store.layout import SENDER_SERVER
from otel_rl.store.writer import Saturated, StoreClosed, StoreUnavailable

log = logging.getLogger(__name__)

# OTLP span flags as the SDK's encoder writes them: whether the parent is remote is known, and if it is.
HAS_IS_REMOTE, IS_REMOTE = 0x100, 0x200
_SCOPE = InstrumentationScope(GATEWAY_SCOPE)
# Spans held while the store cannot write (a full disk), oldest dropped first: a bound on the memory they
# take (each holds its call's messages and token ids).
MAX_HELD_SPANS = 20_000


class CallSpanWriter:
    """`write(record)` on the event loop (cheap); a thread flattens and stores the spans every `flush_ms`."""

    def __init__(
        self,
        submit: Callable[..., Future],  # Store.submit
        resource: Resource,
        *,
        flush_ms: int,
        forward: SpanProcessor | None = None,
    ) -> None:
        self._submit = submit
        self._resource = resource
        self._otlp_resource = _encode_resource(resource)
        self._forward = forward
        self._flush_s = flush_ms / 1000
        self._spans: list[Span] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel-rl-gateway-spans", daemon=True)
        self._thread.start()

    def write(self, record: CallRecord) -> None:
        parent = INVALID_SPAN_CONTEXT
        if record.parent is not None:
            parent = trace.get_current_span(record.parent).get_span_context()
        trace_id = parent.trace_id if parent.is_valid else _random_id(128)
        span_id = _random_id(64)
        span = call_span(record, parent, trace_id, span_id)
        with self._lock:
            self._spans.append(span)
        if self._forward is not None:
            self._forward.on_end(self._sdk_span(record, parent, trace_id, span_id))

    def _sdk_span(self, record: CallRecord, parent: SpanContext, trace_id: int, span_id: int) -> ReadableSpan:
        """The call as the SDK span the tracer would have made (for the OTLP exporter)."""
        status = SdkStatus(StatusCode.UNSET)
        if record.error_type is not None:
            status = SdkStatus(StatusCode.ERROR, record.error_message)
        context = SpanContext(
            trace_id,
            span_id,
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
            trace_state=parent.trace_state if parent.is_valid else None,
        )
        attributes = {k: v for k, v in call_attributes(record).items() if v is not None}
        return ReadableSpan(
            name=span_name(record),
            context=context,
            parent=parent if parent.is_valid else None,
            resource=self._resource,
            attributes=attributes,
            kind=SpanKind.CLIENT,
            status=status,
            start_time=record.start_ns,
            end_time=record.end_ns,
            instrumentation_scope=_SCOPE,
        )

    def close(self) -> None:
        """Store what is pending and stop."""
        self._closing.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._closing.wait(self._flush_s):
            self._flush()
        self._flush()

    def _flush(self) -> None:
        with self._lock:
            spans, self._spans = self._spans, []
        if not spans:
            return
        request = ExportTraceServiceRequest(
            resource_spans=[
                ResourceSpans(
                    resource=self._otlp_resource,
                    scope_spans=[ScopeSpans(scope=PB2Scope(name=GATEWAY_SCOPE), spans=spans)],
                )
            ]
        )
        try:
            batch = traces_batch(request, SENDER_SERVER)  # the server's own: no rollout key to apply
            while True:
                try:
                    future = self._submit(batch, dedup=False)  # fresh span ids: nothing to dedup
                    break
                except Saturated:  # the store's queue is full: wait, as an in-process producer
                    time.sleep(0.01)
            future.result()
        except StoreUnavailable as error:
            # The callers already have their answers: keep the spans (a bounded number) for the next flush,
            # when the disk may have room again, rather than leave holes in their rollouts.
            self._hold(spans, error)
        except Exception:  # the thread must survive a store error; the spans are lost, loudly
            log.exception("the store refused %d gateway spans", len(spans))

    def _hold(self, spans: list[Span], error: StoreUnavailable) -> None:
        if isinstance(error, StoreClosed):
            log.error("the store closed before %d gateway spans could be written", len(spans))
            return
        with self._lock:
            self._spans = spans + self._spans
            dropped = len(self._spans) - MAX_HELD_SPANS
            if dropped > 0:
                self._spans = self._spans[dropped:]
        if dropped > 0:
            log.error("the store cannot write (%s): dropped the %d oldest gateway spans held", error, dropped)


def call_span(record: CallRecord, parent: SpanContext, trace_id: int, span_id: int) -> Span:
    """The OTLP span of one call (a CLIENT span: the gateway is vLLM's client), as the SDK exports it."""
    span = Span(
        trace_id=trace_id.to_bytes(16, "big"),
        span_id=span_id.to_bytes(8, "big"),
        flags=HAS_IS_REMOTE | (IS_REMOTE if parent.is_valid and parent.is_remote else 0),
        name=span_name(record),
        kind=Span.SPAN_KIND_CLIENT,
        start_time_unix_nano=record.start_ns,
        end_time_unix_nano=record.end_ns,
    )
    if parent.is_valid:
        span.parent_span_id = parent.span_id.to_bytes(8, "big")
        span.trace_state = ",".join(f"{k}={v}" for k, v in parent.trace_state.items())
    if record.error_type is not None:
        span.status.CopyFrom(Status(code=Status.STATUS_CODE_ERROR, message=record.error_message or ""))
    _add_attributes(span, call_attributes(record))
    return span


def _add_attributes(span: Span, attributes: dict[str, Any]) -> None:
    """`attributes` (None values left out, as the SDK does) onto `span`. The scalars are set in place: the
    exporter's encoder builds each value as a message of its own, 2.3x the cost (measured); the few lists
    go through it."""
    add = span.attributes.add
    for key, value in attributes.items():
        kind = type(value)
        if kind is str:
            add(key=key).value.string_value = value
        elif kind is int:
            add(key=key).value.int_value = value
        elif kind is float:
            add(key=key).value.double_value = value
        elif kind is bool:
            add(key=key).value.bool_value = value
        elif kind is bytes:
            add(key=key).value.bytes_value = value
        elif value is not None:
            span.attributes.extend(_encode_attributes({key: value}))


def _random_id(bits: int) -> int:
    """As the SDK's RandomIdGenerator: random, never 0 (the invalid id)."""
    while True:
        value = random.getrandbits(bits)
        if value:
            return value
