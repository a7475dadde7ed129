"""Arrow schemas of the raw tables, mirroring otel_rl/store/schema.sql column for column."""

from datetime import datetime

import pyarrow as pa

# JSON columns carry Arrow's JSON extension type: DuckDB then takes the text as JSON as it is, where a string
# column would be parsed again to validate it (orjson writes only valid JSON); that parse was ~15% of the
# store's insert.
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


def received_at_array(received_at: datetime, n: int) -> pa.Array:
    """The received_at column of n rows received together."""
    return pa.repeat(pa.scalar(received_at, type=pa.timestamp("us", tz="UTC")), n)
