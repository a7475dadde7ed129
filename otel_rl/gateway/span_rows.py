"""Call spans written straight into the store's raw-table rows, in batches.

Building an SDK span, encoding it to OTLP and decoding that again in the collector took about a third of
the gateway's CPU per call (py-spy). Here a call becomes the `spans` row that the collector's
`flatten.traces_to_tables` makes of the same span in OTLP — same columns, same JSON (test_gateway_spans.py
compares both paths) — plus its `call_tokens` row; a thread hands the rows to the store's group commit
every `flush_ms`. With `--forward-otlp` the same span (same ids) also goes to the OTLP exporter.
"""

import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Any

import orjson
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import INVALID_SPAN_CONTEXT, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from otel_rl.attributes import GATEWAY_SCOPE
from otel_rl.collector.flatten import PackedTokens, SpanRow, call_tokens_table, is_content_attribute
from otel_rl.gateway.recording import CallRecord, call_attributes, span_name, token_arrays
from otel_rl.store.layout import SENDER_SERVER, SPANS, rows_table
from otel_rl.store.writer import Saturated, StoreClosed, StoreUnavailable

log = logging.getLogger(__name__)

# OTLP span flags as the SDK's encoder writes them: whether the parent is remote is known, and if it is.
HAS_IS_REMOTE, IS_REMOTE = 0x100, 0x200
CLIENT, ERROR = 3, 2  # OTLP SpanKind, StatusCode
_SCOPE = InstrumentationScope(GATEWAY_SCOPE)
# Spans held while the store cannot write (a full disk), oldest dropped first: a bound on the memory they
# take (each holds its call's messages and token ids).
MAX_HELD_SPANS = 20_000


class CallSpanWriter:
    """`write(record)` on the event loop (cheap); a thread stores the rows every `flush_ms`."""

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
        self._resource_json = orjson.dumps(dict(resource.attributes))
        self._forward = forward
        self._flush_s = flush_ms / 1000
        self._rows: list[SpanRow] = []
        self._tokens: list[PackedTokens] = []
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
        tid, sid = f"{trace_id:032x}", f"{span_id:016x}"
        attributes: dict[str, Any] = {}
        content: dict[str, Any] = {}
        for key, value in call_attributes(record, packed_tokens=False).items():
            if value is None:  # the SDK drops them too
                continue
            if is_content_attribute(key):
                content[key] = value
            else:
                attributes[key] = value
        tokens = None
        if record.output is not None:
            tokens = PackedTokens(tid, sid)
            tokens.prompt, tokens.choice_ids, tokens.choice_logprobs = token_arrays(record.output)
            if tokens.prompt is None and not tokens.choice_ids and not tokens.choice_logprobs:
                tokens = None
        failed = record.error_type is not None
        row = SpanRow(
            trace_id=tid,
            span_id=sid,
            parent_span_id=f"{parent.span_id:016x}" if parent.is_valid else None,
            trace_state=(",".join(f"{k}={v}" for k, v in parent.trace_state.items()) or None)
            if parent.is_valid
            else None,
            flags=HAS_IS_REMOTE | (IS_REMOTE if parent.is_valid and parent.is_remote else 0),
            name=span_name(record),
            kind=CLIENT,
            start_time_unix_nano=record.start_ns,
            end_time_unix_nano=record.end_ns,
            attributes=orjson.dumps(attributes),
            content_attributes=orjson.dumps(content) if content else None,
            dropped_attributes_count=0,
            events=b"[]",
            dropped_events_count=0,
            links=b"[]",
            dropped_links_count=0,
            status_code=ERROR if failed else 0,
            status_message=(record.error_message or None) if failed else None,
            resource_attributes=self._resource_json,
            resource_dropped_attributes_count=0,
            resource_schema_url=self._resource.schema_url or None,
            scope_name=GATEWAY_SCOPE,
            scope_version=None,
            scope_attributes=b"{}",
            scope_schema_url=None,
        )
        with self._lock:
            self._rows.append(row)
            if tokens is not None:
                self._tokens.append(tokens)
        if self._forward is not None:
            self._forward.on_end(self._sdk_span(record, parent, trace_id, span_id))

    def _sdk_span(self, record: CallRecord, parent: SpanContext, trace_id: int, span_id: int) -> ReadableSpan:
        """The call as the SDK span the tracer would have made (for the OTLP exporter)."""
        status = Status(StatusCode.UNSET)
        if record.error_type is not None:
            status = Status(StatusCode.ERROR, record.error_message)
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
            rows, tokens = self._rows, self._tokens
            self._rows, self._tokens = [], []
        if not rows:
            return
        now = datetime.now(UTC)
        batch = {
            "spans": rows_table(SPANS, rows, now, SENDER_SERVER),
            "call_tokens": call_tokens_table(tokens, now, SENDER_SERVER),
        }
        try:
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
            self._hold(rows, tokens, error)
        except Exception:  # the thread must survive a store error; the spans are lost, loudly
            log.exception("the store refused %d gateway spans", len(rows))

    def _hold(self, rows: list[SpanRow], tokens: list, error: StoreUnavailable) -> None:
        if isinstance(error, StoreClosed):
            log.error("the store closed before %d gateway spans could be written", len(rows))
            return
        with self._lock:
            self._rows, self._tokens = rows + self._rows, tokens + self._tokens
            dropped = len(self._rows) - MAX_HELD_SPANS
            if dropped > 0:
                kept = {(row.trace_id, row.span_id) for row in self._rows[dropped:]}
                self._rows = self._rows[dropped:]
                self._tokens = [t for t in self._tokens if (t.trace_id, t.span_id) in kept]
        if dropped > 0:
            log.error("the store cannot write (%s): dropped the %d oldest gateway spans held", error, dropped)


def _random_id(bits: int) -> int:
    """As the SDK's RandomIdGenerator: random, never 0 (the invalid id)."""
    while True:
        value = random.getrandbits(bits)
        if value:
            return value
