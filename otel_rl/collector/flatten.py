"""Flatten OTLP export requests into Arrow tables shaped like the raw tables of store/schema.sql."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable
from datetime import datetime

import numpy as np
import orjson
import pyarrow as pa
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from otel_rl.attributes import PROMPT_TOKEN_IDS

# Arrow schemas mirroring otel_rl/store/schema.sql column for column. JSON columns carry Arrow's JSON
# extension type: DuckDB then takes the text as JSON as it is, where a string column would be parsed again
# to validate it (orjson writes only valid JSON); that parse was ~15% of the store's insert.
JSON = pa.json_()
SPANS_SCHEMA = pa.schema(
    [
        ("trace_id", pa.string()),
        ("span_id", pa.string()),
        ("parent_span_id", pa.string()),
        ("trace_state", pa.string()),
        ("flags", pa.uint32()),
        ("name", pa.string()),
        ("kind", pa.int8()),
        ("start_time_unix_nano", pa.uint64()),
        ("end_time_unix_nano", pa.uint64()),
        ("attributes", JSON),
        ("content_attributes", JSON),
        ("dropped_attributes_count", pa.uint32()),
        ("events", JSON),
        ("dropped_events_count", pa.uint32()),
        ("links", JSON),
        ("dropped_links_count", pa.uint32()),
        ("status_code", pa.int8()),
        ("status_message", pa.string()),
        ("resource_attributes", JSON),
        ("resource_dropped_attributes_count", pa.uint32()),
        ("resource_schema_url", pa.string()),
        ("scope_name", pa.string()),
        ("scope_version", pa.string()),
        ("scope_attributes", JSON),
        ("scope_schema_url", pa.string()),
        ("received_at", pa.timestamp("us", tz="UTC")),
    ]
)
CALL_TOKENS_SCHEMA = pa.schema(
    [
        ("trace_id", pa.string()),
        ("span_id", pa.string()),
        ("prompt_token_ids", pa.list_(pa.int32())),
        ("choice_token_ids", pa.list_(pa.list_(pa.int32()))),
        ("choice_logprobs", pa.list_(pa.list_(pa.float32()))),
        ("received_at", pa.timestamp("us", tz="UTC")),
    ]
)
LOGS_SCHEMA = pa.schema(
    [
        ("content_key", pa.string()),
        ("seq", pa.uint64()),
        ("time_unix_nano", pa.uint64()),
        ("observed_time_unix_nano", pa.uint64()),
        ("severity_number", pa.int32()),
        ("severity_text", pa.string()),
        ("event_name", pa.string()),
        ("body", JSON),
        ("attributes", JSON),
        ("dropped_attributes_count", pa.uint32()),
        ("flags", pa.uint32()),
        ("trace_id", pa.string()),
        ("span_id", pa.string()),
        ("resource_attributes", JSON),
        ("resource_dropped_attributes_count", pa.uint32()),
        ("resource_schema_url", pa.string()),
        ("scope_name", pa.string()),
        ("scope_version", pa.string()),
        ("scope_attributes", JSON),
        ("scope_schema_url", pa.string()),
        ("received_at", pa.timestamp("us", tz="UTC")),
    ]
)
METRIC_POINTS_SCHEMA = pa.schema(
    [
        ("content_key", pa.string()),
        ("metric_name", pa.string()),
        ("description", pa.string()),
        ("unit", pa.string()),
        ("metric_metadata", JSON),
        ("type", pa.string()),
        ("aggregation_temporality", pa.int8()),
        ("is_monotonic", pa.bool_()),
        ("start_time_unix_nano", pa.uint64()),
        ("time_unix_nano", pa.uint64()),
        ("attributes", JSON),
        ("value", pa.float64()),
        ("count", pa.uint64()),
        ("sum", pa.float64()),
        ("min", pa.float64()),
        ("max", pa.float64()),
        ("point", JSON),
        ("resource_attributes", JSON),
        ("resource_schema_url", pa.string()),
        ("scope_name", pa.string()),
        ("scope_version", pa.string()),
        ("scope_attributes", JSON),
        ("scope_schema_url", pa.string()),
        ("received_at", pa.timestamp("us", tz="UTC")),
    ]
)

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
    }
)
CONTENT_ATTRIBUTE_PREFIXES = (
    "llm.input_messages.",
    "llm.output_messages.",
    "llm.tools.",
    "gen_ai.prompt.",
    "gen_ai.completion.",
)
Blake2b = type(hashlib.blake2b())


# ---------------------------------------------------------------- AnyValue -> JSON-ready Python values


def _any_value(v: AnyValue) -> object:
    """AnyValue -> the plain Python value that serializes to the contract's JSON (bytes -> base64)."""
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
    if kind == "array_value":
        return [_any_value(e) for e in v.array_value.values]
    if kind == "kvlist_value":
        return _kv_dict(v.kvlist_value.values)
    if kind == "bytes_value":
        return base64.b64encode(v.bytes_value).decode("ascii")
    return None


def _kv_dict(kvs: Iterable) -> dict:
    return {kv.key: _any_value(kv.value) for kv in kvs}


def _kv_json(kvs: Iterable) -> bytes:
    return _dumps(_kv_dict(kvs)) if kvs else _EMPTY_OBJECT


def _hex_or_none(b: bytes) -> str | None:
    return b.hex() or None


# ---------------------------------------------------------------- traces


class PackedTokens:
    """Packed token attributes of one span, still as raw little-endian bytes."""

    __slots__ = ("trace_id", "span_id", "prompt", "choice_ids", "choice_logprobs")

    def __init__(self, trace_id: str, span_id: str) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.prompt: bytes | None = None
        self.choice_ids: dict[int, bytes] = {}
        self.choice_logprobs: dict[int, bytes] = {}


def _take_packed(tokens: PackedTokens, key: str, data: bytes) -> bool:
    """Record a packed token attribute; False when `key` is not one (it then stays an ordinary attribute)."""
    parts = key.split(".")  # otel_rl.prompt_token_ids | otel_rl.choices.{i}.token_ids | ...{i}.logprobs
    if key == PROMPT_TOKEN_IDS:
        target = None
    elif len(parts) == 4 and parts[1] == "choices" and parts[2].isdigit() and parts[3] == "token_ids":
        target = tokens.choice_ids
    elif len(parts) == 4 and parts[1] == "choices" and parts[2].isdigit() and parts[3] == "logprobs":
        target = tokens.choice_logprobs
    else:
        return False
    if len(data) % 4:
        raise ValueError(
            f"span {tokens.trace_id}/{tokens.span_id}: attribute {key!r} has {len(data)} bytes, "
            "not a whole number of 4-byte little-endian values"
        )
    if target is None:
        tokens.prompt = data
    else:
        target[int(parts[2])] = data
    return True


class _ContentKeys(dict):
    """Attribute key -> whether it is a content attribute, remembered: the hot loop meets the same few dozen
    keys again and again (bounded, as OpenInference numbers its message keys)."""

    def __missing__(self, key: str) -> bool:
        is_content = key in CONTENT_ATTRIBUTES or key.startswith(CONTENT_ATTRIBUTE_PREFIXES)
        if len(self) < 65536:
            self[key] = is_content
        return is_content


_IS_CONTENT = _ContentKeys()


def is_content_attribute(key: str) -> bool:
    """Whether a span attribute carries a call's content (it goes to `spans.content_attributes`)."""
    return _IS_CONTENT[key]


def _span_attributes(
    kvs: Iterable, trace_id: str, span_id: str
) -> tuple[bytes, bytes | None, PackedTokens | None]:
    """Span attributes as JSON, then its content attributes as JSON (None without any), with packed
    `otel_rl.*` token arrays taken out (the hot loop of ingest: every protobuf access here costs)."""
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
                if _take_packed(tokens, key, v.bytes_value):
                    continue
                value = _any_value(v)
            else:
                value = _any_value(v)
        if _IS_CONTENT[key]:
            content[key] = value
        else:
            out[key] = value
    return (_dumps(out) if out else _EMPTY_OBJECT), (_dumps(content) if content else None), tokens


def _events_json(events: Iterable) -> bytes:
    return _dumps(
        [
            {
                "time_unix_nano": e.time_unix_nano,
                "name": e.name,
                "attributes": _kv_dict(e.attributes),
                "dropped_attributes_count": e.dropped_attributes_count,
            }
            for e in events
        ]
    )


def _links_json(links: Iterable) -> bytes:
    return _dumps(
        [
            {
                "trace_id": _hex_or_none(link.trace_id),
                "span_id": _hex_or_none(link.span_id),
                "trace_state": link.trace_state,
                "attributes": _kv_dict(link.attributes),
                "dropped_attributes_count": link.dropped_attributes_count,
                "flags": link.flags,
            }
            for link in links
        ]
    )


def traces_to_tables(req: ExportTraceServiceRequest, received_at: datetime) -> dict[str, pa.Table]:
    """ExportTraceServiceRequest -> {"spans": ..., "call_tokens": ...} Arrow tables."""
    rows: list[tuple] = []
    packed: list[PackedTokens] = []
    for rs in req.resource_spans:
        resource = rs.resource
        r_attrs = _kv_json(resource.attributes)
        r_dropped = resource.dropped_attributes_count
        r_schema = rs.schema_url or None
        for ss in rs.scope_spans:
            scope = ss.scope
            s_name, s_version, s_attrs = scope.name or None, scope.version or None, _kv_json(scope.attributes)
            s_schema = ss.schema_url or None
            for span in ss.spans:
                tid = span.trace_id.hex()
                sid = span.span_id.hex()
                attrs_json, content_json, tokens = _span_attributes(span.attributes, tid, sid)
                if tokens is not None:
                    packed.append(tokens)
                status = span.status
                rows.append(
                    (
                        tid,
                        sid,
                        span.parent_span_id.hex() or None,
                        span.trace_state or None,
                        span.flags,
                        span.name,
                        span.kind,
                        span.start_time_unix_nano,
                        span.end_time_unix_nano,
                        attrs_json,
                        content_json,
                        span.dropped_attributes_count,
                        _events_json(span.events) if span.events else _EMPTY_ARRAY,
                        span.dropped_events_count,
                        _links_json(span.links) if span.links else _EMPTY_ARRAY,
                        span.dropped_links_count,
                        status.code,
                        status.message or None,
                        r_attrs,
                        r_dropped,
                        r_schema,
                        s_name,
                        s_version,
                        s_attrs,
                        s_schema,
                    )
                )
    return {
        "spans": rows_table(SPANS_SCHEMA, rows, received_at),
        "call_tokens": call_tokens_table(packed, received_at),
    }


def rows_table(schema: pa.Schema, rows: list[tuple], received_at: datetime) -> pa.Table:
    """Columns from row tuples (every field of `schema` but the trailing received_at), then received_at."""
    columns = zip(*rows, strict=True) if rows else [()] * (len(schema) - 1)
    arrays = [_array(col, field.type) for col, field in zip(columns, schema, strict=False)]
    arrays.append(_received_at(received_at, len(rows)))
    return pa.Table.from_arrays(arrays, schema=schema)


def _received_at(received_at: datetime, n: int) -> pa.Array:
    return pa.repeat(pa.scalar(received_at, type=pa.timestamp("us", tz="UTC")), n)


def _array(values: Iterable, type_: pa.DataType) -> pa.Array:
    if type_ != JSON:
        return pa.array(values, type=type_)
    # orjson's bytes are valid UTF-8: viewed as strings as they are, 2x faster than pyarrow's JSON conversion.
    return pa.ExtensionArray.from_storage(JSON, pa.array(values, type=pa.binary()).view(pa.string()))


# ---------------------------------------------------------------- call_tokens


def _list_array(chunks: list[bytes | None], dtype: str, value_type: pa.DataType) -> pa.Array:
    """One list per chunk of packed little-endian values (None -> null list), without per-value objects."""
    lengths = np.fromiter((len(c) if c is not None else 0 for c in chunks), dtype=np.int64, count=len(chunks))
    offsets = np.zeros(len(chunks) + 1, dtype=np.int32)
    np.cumsum(lengths // 4, out=offsets[1:])
    values = np.frombuffer(b"".join(c for c in chunks if c is not None), dtype=dtype)
    mask = pa.array(np.fromiter((c is None for c in chunks), dtype=bool, count=len(chunks)))
    return pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(values, type=value_type), mask=mask if mask.true_count else None
    )


def _nested_list_array(
    per_span: list[dict[int, bytes]], n_choices: list[int], dtype: str, value_type: pa.DataType
) -> pa.Array:
    """One list of per-choice lists per span, choices in index order; an unrecorded choice is a null list."""
    flat = [choices.get(i) for choices, n in zip(per_span, n_choices, strict=True) for i in range(n)]
    inner = _list_array(flat, dtype, value_type)
    offsets = np.zeros(len(per_span) + 1, dtype=np.int32)
    np.cumsum(n_choices, out=offsets[1:])
    mask = pa.array([not choices for choices in per_span], type=pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets), inner, mask=mask if mask.true_count else None)


def call_tokens_table(packed: list[PackedTokens], received_at: datetime) -> pa.Table:
    """call_tokens rows for the spans that carried packed token attributes (received with them)."""
    n_choices = [max([*t.choice_ids, *t.choice_logprobs], default=-1) + 1 for t in packed]
    arrays = [
        pa.array([t.trace_id for t in packed], type=pa.string()),
        pa.array([t.span_id for t in packed], type=pa.string()),
        _list_array([t.prompt for t in packed], "<i4", pa.int32()),
        _nested_list_array([t.choice_ids for t in packed], n_choices, "<i4", pa.int32()),
        _nested_list_array([t.choice_logprobs for t in packed], n_choices, "<f4", pa.float32()),
        _received_at(received_at, len(packed)),
    ]
    return pa.Table.from_arrays(arrays, schema=CALL_TOKENS_SCHEMA)


# ---------------------------------------------------------------- logs


def _record_hasher(
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


def _content_key(seed: Blake2b, record_bytes: bytes) -> str:
    h = seed.copy()
    h.update(len(record_bytes).to_bytes(8, "little"))
    h.update(record_bytes)
    return h.hexdigest()


def logs_to_tables(
    req: ExportLogsServiceRequest, received_at: datetime, seq_start: int
) -> dict[str, pa.Table]:
    """ExportLogsServiceRequest -> {"logs": ...}; `seq` numbers records from `seq_start` in request order."""
    rows: list[tuple] = []
    seq = seq_start
    for rl in req.resource_logs:
        resource = rl.resource
        r_attrs = _kv_json(resource.attributes)
        r_dropped = resource.dropped_attributes_count
        r_schema = rl.schema_url or None
        for sl in rl.scope_logs:
            scope = sl.scope
            s_name, s_version, s_attrs = scope.name or None, scope.version or None, _kv_json(scope.attributes)
            seed = _record_hasher(resource, rl.schema_url, scope, sl.schema_url)
            for rec in sl.log_records:
                rows.append(
                    (
                        _content_key(seed, rec.SerializeToString()),
                        seq,
                        rec.time_unix_nano,
                        rec.observed_time_unix_nano,
                        rec.severity_number,
                        rec.severity_text or None,
                        rec.event_name or None,
                        _dumps(_any_value(rec.body)),
                        _kv_json(rec.attributes),
                        rec.dropped_attributes_count,
                        rec.flags,
                        _hex_or_none(rec.trace_id),
                        _hex_or_none(rec.span_id),
                        r_attrs,
                        r_dropped,
                        r_schema,
                        s_name,
                        s_version,
                        s_attrs,
                        sl.schema_url or None,
                    )
                )
                seq += 1
    return {"logs": rows_table(LOGS_SCHEMA, rows, received_at)}


# ---------------------------------------------------------------- metrics


def _exemplars(point: Message) -> list[dict]:
    return [
        {
            "time_unix_nano": e.time_unix_nano,
            "value": e.as_double if e.WhichOneof("value") == "as_double" else e.as_int,
            "filtered_attributes": _kv_dict(e.filtered_attributes),
            "trace_id": _hex_or_none(e.trace_id),
            "span_id": _hex_or_none(e.span_id),
        }
        for e in point.exemplars
    ]


def _point_fields(kind: str, p: Message) -> tuple:
    """(value, count, sum, min, max, whole point as a dict) of one data point of a metric of type `kind`."""
    if kind in ("gauge", "sum"):
        value = float(p.as_double if p.WhichOneof("value") == "as_double" else p.as_int)
        return value, None, None, None, None, {"value": value, "flags": p.flags, "exemplars": _exemplars(p)}
    if kind == "summary":
        quantiles = [{"quantile": q.quantile, "value": q.value} for q in p.quantile_values]
        whole = {"count": p.count, "sum": p.sum, "quantile_values": quantiles, "flags": p.flags}
        return None, p.count, p.sum, None, None, whole
    # histogram / exponential_histogram: sum, min and max are optional fields
    total, low, high = (getattr(p, f) if p.HasField(f) else None for f in ("sum", "min", "max"))
    whole = {
        "count": p.count,
        "sum": total,
        "min": low,
        "max": high,
        "flags": p.flags,
        "exemplars": _exemplars(p),
    }
    if kind == "histogram":
        whole |= {"bucket_counts": list(p.bucket_counts), "explicit_bounds": list(p.explicit_bounds)}
    else:
        whole |= {
            "scale": p.scale,
            "zero_count": p.zero_count,
            "zero_threshold": p.zero_threshold,
            "positive": {"offset": p.positive.offset, "bucket_counts": list(p.positive.bucket_counts)},
            "negative": {"offset": p.negative.offset, "bucket_counts": list(p.negative.bucket_counts)},
        }
    return None, p.count, total, low, high, whole


def metrics_to_tables(req: ExportMetricsServiceRequest, received_at: datetime) -> dict[str, pa.Table]:
    """ExportMetricsServiceRequest -> {"metric_points": ...}: one row per data point."""
    rows: list[tuple] = []
    for rm in req.resource_metrics:
        resource = rm.resource
        r_attrs = _kv_json(resource.attributes)
        for sm in rm.scope_metrics:
            scope = sm.scope
            seed = _record_hasher(resource, rm.schema_url, scope, sm.schema_url)
            s_attrs = _kv_json(scope.attributes)
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind is None:
                    continue
                data = getattr(metric, kind)
                temporality = getattr(data, "aggregation_temporality", None)
                monotonic = data.is_monotonic if kind == "sum" else None
                header = f"{metric.name}\x00{metric.unit}\x00{kind}\x00".encode()
                for p in data.data_points:
                    value, count, total, low, high, whole = _point_fields(kind, p)
                    rows.append(
                        (
                            _content_key(seed, header + p.SerializeToString()),
                            metric.name,
                            metric.description or None,
                            metric.unit or None,
                            _kv_json(metric.metadata),
                            kind,
                            temporality,
                            monotonic,
                            p.start_time_unix_nano,
                            p.time_unix_nano,
                            _kv_json(p.attributes),
                            value,
                            count,
                            total,
                            low,
                            high,
                            _dumps(whole),
                            r_attrs,
                            rm.schema_url or None,
                            scope.name or None,
                            scope.version or None,
                            s_attrs,
                            sm.schema_url or None,
                        )
                    )
    return {"metric_points": rows_table(METRIC_POINTS_SCHEMA, rows, received_at)}
