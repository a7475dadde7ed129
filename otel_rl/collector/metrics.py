"""Flatten OTLP metric export requests into rows of the `metric_points` table: one row per data point."""

from __future__ import annotations

from datetime import datetime

import orjson
import pyarrow as pa
from google.protobuf.message import Message
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_rl.collector.flatten import (
    content_key,
    hex_or_none,
    kv_dict,
    kv_json,
    kv_json_identity,
    record_hasher,
    resource_json_identity,
)
from otel_rl.store.arrow_rows import rows_table
from otel_rl.store.identity import NO_IDENTITY, Identity
from otel_rl.store.layout import METRIC_POINTS, Sender

MetricPointRow = METRIC_POINTS.row


def _exemplars(point: Message) -> list[dict]:
    return [
        {
            "time_unix_nano": e.time_unix_nano,
            "value": e.as_double if e.WhichOneof("value") == "as_double" else e.as_int,
            "filtered_attributes": kv_dict(e.filtered_attributes),
            "trace_id": hex_or_none(e.trace_id),
            "span_id": hex_or_none(e.span_id),
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


def metrics_to_tables(
    req: ExportMetricsServiceRequest, received_at: datetime, sender: Sender, key: Identity = NO_IDENTITY
) -> dict[str, pa.Table]:
    """ExportMetricsServiceRequest from `sender` -> {"metric_points": ...}: one row per data point; `key` as
    for flatten.traces_to_tables."""
    rows: list[MetricPointRow] = []
    for rm in req.resource_metrics:
        resource = rm.resource
        r_attrs, r_identity = resource_json_identity(resource, key)
        for sm in rm.scope_metrics:
            scope = sm.scope
            seed = record_hasher(resource, rm.schema_url, scope, sm.schema_url)
            s_attrs = kv_json(scope.attributes)
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
                    attributes, identity = kv_json_identity(p.attributes, key, r_identity)
                    rows.append(
                        MetricPointRow(
                            content_key=content_key(seed, header + p.SerializeToString()),
                            metric_name=metric.name,
                            description=metric.description or None,
                            unit=metric.unit or None,
                            metric_metadata=kv_json(metric.metadata),
                            type=kind,
                            aggregation_temporality=temporality,
                            is_monotonic=monotonic,
                            start_time_unix_nano=p.start_time_unix_nano,
                            time_unix_nano=p.time_unix_nano,
                            attributes=attributes,
                            value=value,
                            count=count,
                            sum=total,
                            min=low,
                            max=high,
                            point=orjson.dumps(whole),
                            rollout_id=identity[0],
                            attempt_id=identity[1],
                            group_id=identity[2],
                            task_id=identity[3],
                            split=identity[4],
                            resource_attributes=r_attrs,
                            resource_schema_url=rm.schema_url or None,
                            scope_name=scope.name or None,
                            scope_version=scope.version or None,
                            scope_attributes=s_attrs,
                            scope_schema_url=sm.schema_url or None,
                        )
                    )
    return {"metric_points": rows_table(METRIC_POINTS, rows, received_at, sender)}
