"""Flatten OTLP export requests into Arrow tables shaped like the raw tables of store/schema.sql."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable
from datetime import datetime

import orjson
import pyarrow as pa
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from otel_rl.collector.limits import MAX_VALUE_DEPTH, check_indexed_key
from otel_rl.collector.packed import PackedTokens, call_tokens_table, take_packed
from otel_rl.store.arrow_rows import rows_table
from otel_rl.store.identity import NO_IDENTITY, Identity, identity_of, resolve
from otel_rl.store.layout import LOGS, SPANS, Sender

SpanRow = SPANS.row
LogRow = LOGS.row

# orjson writes compact UTF-8 JSON ~4x faster than the json module; NaN and Infinity become null.
_dumps = orjson.dumps
_EMPTY_OBJECT = b"{}"
_EMPTY_ARRAY = b"[]"
_SCALARS = frozenset({"string_value", "int_value", "double_value", "bool_value"})
_PACKED_PREFIX = "otel_rl."
# Span attributes that hold a call's content (messages, request and response bodies, tool definitions) go to
# spans.content_attributes, so that the views parse the small rest of a call's attributes cheaply and the
# content only when a query reads messages.
CONTENT_ATTRIBUTES = frozenset(
    {
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
        "gen_ai.tool.definitions",
        "input.value",
        "output.value",
        "haystack.component.input",  # Haystack's own tracer: a component run's inputs and outputs
        "haystack.component.output",
    }
)
# Each prefix is followed by an index (a message, tool or choice number), bounded by check_indexed_key.
CONTENT_ATTRIBUTE_PREFIXES = (
    "llm.input_messages.",
    "llm.output_messages.",
    "llm.tools.",
    "gen_ai.prompt.",
    "gen_ai.completion.",
)
Blake2b = type(hashlib.blake2b())


# ---------------------------------------------------------------- AnyValue -> JSON-ready Python values


def _any_value(v: AnyValue, depth: int = 0) -> object:
    """AnyValue -> the plain Python value that serializes to the contract's JSON (bytes -> base64);
    `depth` counts the arrays and key-value lists it is inside (at most MAX_VALUE_DEPTH)."""
    # Most values are non-empty strings: one field access instead of a oneof dispatch (ingest's hot path).
    value = v.string_value
    if value:
        return value
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return value
    if kind == "int_value":
        return v.int_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "double_value":
        return v.double_value
    if kind == "array_value" or kind == "kvlist_value":
        if depth >= MAX_VALUE_DEPTH:
            raise ValueError(
                f"a value nests arrays or key-value lists over the limit of {MAX_VALUE_DEPTH} levels"
            )
        if kind == "array_value":
            return [_any_value(e, depth + 1) for e in v.array_value.values]
        return kv_dict(v.kvlist_value.values, depth + 1)
    if kind == "bytes_value":
        return base64.b64encode(v.bytes_value).decode("ascii")
    return None


def kv_dict(kvs: Iterable, depth: int = 0) -> dict:
    return {kv.key: _any_value(kv.value, depth) for kv in kvs}


def kv_json(kvs: Iterable) -> bytes:
    return _dumps(kv_dict(kvs)) if kvs else _EMPTY_OBJECT


def kv_json_identity(kvs: Iterable, key: Identity, resource: Identity) -> tuple[bytes, Identity]:
    """A record's attributes as JSON, and its identity (`record_identity`)."""
    if not kvs:
        return _EMPTY_OBJECT, resource
    attributes = kv_dict(kvs)
    return _dumps(attributes), record_identity(attributes, key, resource)


def record_identity(attributes: dict, key: Identity, resource: Identity) -> Identity:
    """The identity columns of a record with `attributes`: the one rule of the raw tables' identity
    (store/identity.py), applied as the record is flattened. `key` is its rollout key's identity and
    `resource` its resource's already under the key's (`resource_json_identity`)."""
    return own_identity(identity_of(attributes), key, resource)


def own_identity(own: Identity, key: Identity, resource: Identity) -> Identity:
    """The key's identity, else the record's `own`, else its resource's."""
    return resource if own == NO_IDENTITY else resolve(key, resolve(own, resource))


def resource_json_identity(resource: Resource, key: Identity) -> tuple[bytes, Identity]:
    """A resource's attributes as JSON, and the identity of its records that name none of their own: the
    key's, else the resource's."""
    attributes = kv_dict(resource.attributes)
    if not attributes:
        return _EMPTY_OBJECT, key
    return _dumps(attributes), resolve(key, identity_of(attributes))


def hex_or_none(b: bytes) -> str | None:
    return b.hex() or None


# ---------------------------------------------------------------- traces


class _ContentKeys(dict):
    """Attribute key -> whether it is a content attribute, remembered: the hot loop meets the same few dozen
    keys again and again (bounded, as OpenInference numbers its message keys). An indexed content key over
    its limit raises ValueError, and is never remembered: the check costs nothing for keys seen before."""

    def __missing__(self, key: str) -> bool:
        is_content = key in CONTENT_ATTRIBUTES
        if not is_content:
            for prefix in CONTENT_ATTRIBUTE_PREFIXES:
                if key.startswith(prefix):
                    check_indexed_key(key, prefix)
                    is_content = True
                    break
        if len(self) < 65536:
            self[key] = is_content
        return is_content


_IS_CONTENT = _ContentKeys()


def is_content_attribute(key: str) -> bool:
    """Whether a span attribute carries a call's content (it goes to `spans.content_attributes`); raises
    ValueError for an indexed content key over its limit (limits.check_indexed_key)."""
    return _IS_CONTENT[key]


def _span_attributes(
    kvs: Iterable, trace_id: str, span_id: str
) -> tuple[bytes, bytes | None, PackedTokens | None, Identity]:
    """Span attributes as JSON, then its content attributes as JSON (None without any), with packed
    `otel_rl.*` token arrays taken out (the hot loop of ingest: every protobuf access here costs), and the
    identity they give."""
    out = {}
    content = {}
    tokens = None
    for kv in kvs:
        key = kv.key
        v = kv.value
        # Inlined _any_value for the common kinds (a call per attribute costs here): a non-empty string or a
        # non-zero number is the value the oneof holds, read without a oneof dispatch (5% of this loop).
        value = v.string_value or v.int_value or v.double_value
        if not value:
            kind = v.WhichOneof("value")
            if kind in _SCALARS:
                value = getattr(v, kind)
            elif kind == "bytes_value" and key.startswith(_PACKED_PREFIX):
                if tokens is None:
                    tokens = PackedTokens(trace_id, span_id)
                if take_packed(tokens, key, v.bytes_value):
                    continue
                value = _any_value(v)
            else:
                value = _any_value(v)
        if _IS_CONTENT[key]:
            content[key] = value
        else:
            out[key] = value
    own = identity_of(out) if out else NO_IDENTITY
    return (_dumps(out) if out else _EMPTY_OBJECT), (_dumps(content) if content else None), tokens, own


def _events_json(events: Iterable) -> bytes:
    return _dumps(
        [
            {
                "time_unix_nano": e.time_unix_nano,
                "name": e.name,
                "attributes": kv_dict(e.attributes),
                "dropped_attributes_count": e.dropped_attributes_count,
            }
            for e in events
        ]
    )


def _links_json(links: Iterable) -> bytes:
    return _dumps(
        [
            {
                "trace_id": hex_or_none(link.trace_id),
                "span_id": hex_or_none(link.span_id),
                "trace_state": link.trace_state,
                "attributes": kv_dict(link.attributes),
                "dropped_attributes_count": link.dropped_attributes_count,
                "flags": link.flags,
            }
            for link in links
        ]
    )


def _id_lengths(trace_id: bytes, span_id: bytes, parent_span_id: bytes = b"") -> str:
    """Why a record's ids are refused: OTLP ids are 16 (trace) and 8 (span) bytes; 0 where optional."""
    return (
        f"ids of {len(trace_id)}/{len(span_id)}/{len(parent_span_id)} bytes (trace/span/parent span): "
        "a trace id has 16 bytes and a span id 8"
    )


def traces_to_tables(
    req: ExportTraceServiceRequest, received_at: datetime, sender: Sender, key: Identity = NO_IDENTITY
) -> dict[str, pa.Table]:
    """ExportTraceServiceRequest from `sender` -> {"spans": ..., "call_tokens": ...} Arrow tables; `key`: the
    identity of the rollout key that sent it, which its spans' identity columns take whatever they say."""
    rows: list[SpanRow] = []
    packed: list[PackedTokens] = []
    for rs in req.resource_spans:
        resource = rs.resource
        r_attrs, r_identity = resource_json_identity(resource, key)
        r_dropped = resource.dropped_attributes_count
        r_schema = rs.schema_url or None
        for ss in rs.scope_spans:
            scope = ss.scope
            s_name, s_version, s_attrs = scope.name or None, scope.version or None, kv_json(scope.attributes)
            s_schema = ss.schema_url or None
            for span in ss.spans:
                tid = span.trace_id.hex()
                sid = span.span_id.hex()
                try:
                    if len(tid) != 32 or len(sid) != 16 or len(span.parent_span_id) not in (0, 8):
                        raise ValueError(_id_lengths(span.trace_id, span.span_id, span.parent_span_id))
                    attrs_json, content_json, tokens, own = _span_attributes(span.attributes, tid, sid)
                    events_json = _events_json(span.events) if span.events else _EMPTY_ARRAY
                    links_json = _links_json(span.links) if span.links else _EMPTY_ARRAY
                except ValueError as exc:
                    raise ValueError(f"span {tid[:32]}/{sid[:16]}: {exc}") from None
                if tokens is not None:
                    packed.append(tokens)
                start = span.start_time_unix_nano
                # A span that ends before it starts (a clock stepped back, or a hostile sender) is stored as
                # ending when it starts: reads subtract the unsigned times, and one such row failed them all.
                end = span.end_time_unix_nano
                if end < start:
                    end = start
                status = span.status
                identity = own_identity(own, key, r_identity)
                rows.append(
                    SpanRow(
                        trace_id=tid,
                        span_id=sid,
                        parent_span_id=span.parent_span_id.hex() or None,
                        trace_state=span.trace_state or None,
                        flags=span.flags,
                        name=span.name,
                        kind=span.kind,
                        start_time_unix_nano=start,
                        end_time_unix_nano=end,
                        attributes=attrs_json,
                        content_attributes=content_json,
                        dropped_attributes_count=span.dropped_attributes_count,
                        events=events_json,
                        dropped_events_count=span.dropped_events_count,
                        links=links_json,
                        dropped_links_count=span.dropped_links_count,
                        status_code=status.code,
                        status_message=status.message or None,
                        rollout_id=identity[0],
                        attempt_id=identity[1],
                        group_id=identity[2],
                        task_id=identity[3],
                        split=identity[4],
                        resource_attributes=r_attrs,
                        resource_dropped_attributes_count=r_dropped,
                        resource_schema_url=r_schema,
                        scope_name=s_name,
                        scope_version=s_version,
                        scope_attributes=s_attrs,
                        scope_schema_url=s_schema,
                    )
                )
    return {
        "spans": rows_table(SPANS, rows, received_at, sender),
        "call_tokens": call_tokens_table(packed, received_at, sender),
    }


# ---------------------------------------------------------------- logs


def record_hasher(
    resource: Resource, resource_schema_url: str, scope: InstrumentationScope, scope_schema_url: str
) -> Blake2b:
    """A hash seeded with the resource and scope; copy it and add one record to get its content key."""
    h = hashlib.blake2b(digest_size=16)
    for part in (
        resource.SerializeToString(),
        resource_schema_url.encode(),
        scope.SerializeToString(),
        scope_schema_url.encode(),
    ):
        # Length-prefix every part so that different splits of the same bytes hash differently.
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h


def content_key(seed: Blake2b, record_bytes: bytes) -> str:
    h = seed.copy()
    h.update(len(record_bytes).to_bytes(8, "little"))
    h.update(record_bytes)
    return h.hexdigest()


def logs_to_tables(
    req: ExportLogsServiceRequest,
    received_at: datetime,
    seq_start: int,
    sender: Sender,
    key: Identity = NO_IDENTITY,
) -> dict[str, pa.Table]:
    """ExportLogsServiceRequest from `sender` -> {"logs": ...}; `seq` numbers records from `seq_start` in
    request order; `key` as for traces_to_tables."""
    rows: list[LogRow] = []
    seq = seq_start
    for rl in req.resource_logs:
        resource = rl.resource
        r_attrs, r_identity = resource_json_identity(resource, key)
        r_dropped = resource.dropped_attributes_count
        r_schema = rl.schema_url or None
        for sl in rl.scope_logs:
            scope = sl.scope
            s_name, s_version, s_attrs = scope.name or None, scope.version or None, kv_json(scope.attributes)
            seed = record_hasher(resource, rl.schema_url, scope, sl.schema_url)
            for rec in sl.log_records:
                # optional on a log record, and each as long as a span's when present
                if len(rec.trace_id) not in (0, 16) or len(rec.span_id) not in (0, 8):
                    raise ValueError(f"log record: {_id_lengths(rec.trace_id, rec.span_id)}")
                attributes, identity = kv_json_identity(rec.attributes, key, r_identity)
                rows.append(
                    LogRow(
                        content_key=content_key(seed, rec.SerializeToString()),
                        seq=seq,
                        time_unix_nano=rec.time_unix_nano,
                        observed_time_unix_nano=rec.observed_time_unix_nano,
                        severity_number=rec.severity_number,
                        severity_text=rec.severity_text or None,
                        event_name=rec.event_name or None,
                        body=_dumps(_any_value(rec.body)),
                        attributes=attributes,
                        dropped_attributes_count=rec.dropped_attributes_count,
                        flags=rec.flags,
                        trace_id=hex_or_none(rec.trace_id),
                        span_id=hex_or_none(rec.span_id),
                        rollout_id=identity[0],
                        attempt_id=identity[1],
                        group_id=identity[2],
                        task_id=identity[3],
                        split=identity[4],
                        resource_attributes=r_attrs,
                        resource_dropped_attributes_count=r_dropped,
                        resource_schema_url=r_schema,
                        scope_name=s_name,
                        scope_version=s_version,
                        scope_attributes=s_attrs,
                        scope_schema_url=sl.schema_url or None,
                    )
                )
                seq += 1
    return {"logs": rows_table(LOGS, rows, received_at, sender)}
