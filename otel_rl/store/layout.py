"""The raw tables' layouts, each column defined once: the DuckDB DDL, the Arrow schema producers build and the
row type they build it from all derive from the definitions here.

Raw tables hold every field an exporter sends, one row per span / log record / metric data point, and who
sent it (`sender`: which credential, set by the server, never by the sender). JSON
columns hold OTLP key-value lists as objects ({"key": value}); AnyValue maps to JSON (string, bool, int,
double, array, kvlist -> object, bytes -> base64 string). Timestamps are kept as the exporter sent them
(unsigned nanoseconds since the epoch; an end before its start is stored as the start).
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

# JSON columns carry Arrow's JSON extension type: DuckDB then takes the text as JSON as it is, where a string
# column would be parsed again to validate it (orjson writes only valid JSON); that parse was ~15% of the
# store's insert.
JSON = pa.json_()
RECEIVED_AT = pa.timestamp("us", tz="UTC")
# Who vouches for a raw row (docs/security.md "What only the server vouches for"): the server's own components
# in its process (the gateway's call spans), a sender holding the admin token (the controller, the trainer,
# graders, /v1/rewards), or a harness holding a rollout key. Only the first two are read as exact tokens,
# statuses and trainer steps; a rollout key's rows are its claims.
Sender = Literal["server", "admin", "rollout"]
SENDER_SERVER: Sender = "server"
SENDER_ADMIN: Sender = "admin"
SENDER_ROLLOUT: Sender = "rollout"
VOUCHED_SENDERS: tuple[Sender, ...] = (SENDER_SERVER, SENDER_ADMIN)
_DUCKDB_TYPES = {
    pa.string(): "VARCHAR",
    JSON: "JSON",
    pa.bool_(): "BOOLEAN",
    pa.int8(): "TINYINT",
    pa.int32(): "INTEGER",
    pa.uint32(): "UINTEGER",
    pa.uint64(): "UBIGINT",
    pa.float32(): "FLOAT",
    pa.float64(): "DOUBLE",
    pa.date32(): "DATE",
    RECEIVED_AT: "TIMESTAMPTZ",
}


def duckdb_type(arrow_type: pa.DataType) -> str:
    """The DuckDB type a column of `arrow_type` is stored as."""
    if pa.types.is_list(arrow_type):
        return duckdb_type(arrow_type.value_type) + "[]"
    return _DUCKDB_TYPES[arrow_type]


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    comment: str = ""
    not_null: bool = False
    # Set by the store's writer, not by whoever builds the rows (not in `Layout.schema`).
    by_store: bool = False


@dataclass(frozen=True)
class Layout:
    """One table: its columns in order; for the tables exports write, what makes a row a duplicate."""

    table: str
    columns: tuple[Column, ...]
    # The columns naming a record: a row whose key is stored already (a retried export, a record sent twice
    # in one request) is stored once.
    key: tuple[str, ...] = ()
    # A time its sender sets, the same in a resent record: the dedup check reads only stored rows of the
    # batch's range of it, so that DuckDB skips the other row groups (without it every commit scanned every
    # stored key: 65 ms of CPU per 2,048-span commit at 1M spans, about 5 ms with it).
    sent_time: str | None = None

    @property
    def commit_numbered(self) -> bool:
        """Whether its rows carry the commit that wrote them (`commit_seq`)."""
        return any(column.name == "commit_seq" for column in self.columns)

    @property
    def built(self) -> tuple[Column, ...]:
        """The columns producers build, received_at and sender last."""
        return tuple(column for column in self.columns if not column.by_store)

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of the rows producers hand to the store."""
        return pa.schema([(column.name, column.type) for column in self.built])

    @property
    def row(self) -> type:
        """The row type producers fill by name: every built column but received_at and sender (set per
        batch)."""
        return _row_type(self)

    def ddl(self) -> str:
        """CREATE TABLE (where missing) with every column, then a COMMENT per column (duckdb_columns())."""
        columns = ",\n    ".join(
            f"{c.name} {duckdb_type(c.type)}{' NOT NULL' if c.not_null else ''}" for c in self.columns
        )
        comments = "".join(
            f"\nCOMMENT ON COLUMN {self.table}.{c.name} IS '{c.comment.replace(chr(39), chr(39) * 2)}';"
            for c in self.columns
            if c.comment
        )
        return f"CREATE TABLE IF NOT EXISTS {self.table} (\n    {columns}\n);{comments}"

    def add_missing_columns(self) -> str:
        """ALTER statements adding the columns a store made by an earlier version lacks."""
        return "".join(
            f"ALTER TABLE {self.table} ADD COLUMN IF NOT EXISTS {c.name} {duckdb_type(c.type)};"
            for c in self.columns
        )


_ROW_TYPES: dict[str, type] = {}
PER_BATCH = ("received_at", "sender")


def _row_type(layout: Layout) -> type:
    if layout.table not in _ROW_TYPES:
        names = [column.name for column in layout.built if column.name not in PER_BATCH]
        _ROW_TYPES[layout.table] = namedtuple(layout.table.title().replace("_", "") + "Row", names)
    return _ROW_TYPES[layout.table]


def _received_at() -> Column:
    return Column("received_at", RECEIVED_AT, "when the server received the export (its clock)")


def _sender() -> Column:
    return Column(
        "sender",
        pa.string(),
        "who sent the row, as the server authenticated it: server (its own components), admin (the admin"
        " token), rollout (a rollout key: the harness's claims); NULL for rows stored before it was recorded",
    )


def _commit_seq() -> Column:
    return Column(
        "commit_seq",
        pa.uint64(),
        "the store's commit that wrote the row: the normalized tables are maintained in this order",
        by_store=True,
    )


def _identity() -> tuple[Column, ...]:
    """The rollout identity of a record, resolved once by the collector as it flattens the record (the rule
    of store/identity.py): a rollout key's own identity, else the record's attribute, else its resource's."""
    return tuple(
        Column(name, pa.string(), f"{key} {rule}")
        for name, key, rule in (
            ("rollout_id", "otel_rl.rollout.id", _IDENTITY_RULE),
            ("attempt_id", "otel_rl.attempt.id", "(as rollout_id)"),
            ("group_id", "otel_rl.group.id", "(as rollout_id)"),
            ("task_id", "otel_rl.task.id", "(as rollout_id)"),
            ("split", "otel_rl.split", "(as rollout_id)"),
        )
    )


_IDENTITY_RULE = (
    "as resolved at ingest: the rollout key's own (it wins over what the record says), else the record's"
    " attribute, else its resource's; NULL when none says (the views then place a span by its trace)"
)


def _origin(*, dropped_resource: bool = True) -> tuple[Column, ...]:
    """The resource and scope columns every raw table ends with."""
    resource = (Column("resource_attributes", JSON),)
    if dropped_resource:
        resource += (Column("resource_dropped_attributes_count", pa.uint32()),)
    return (
        *resource,
        Column("resource_schema_url", pa.string()),
        Column("scope_name", pa.string()),
        Column("scope_version", pa.string()),
        Column("scope_attributes", JSON),
        Column("scope_schema_url", pa.string()),
    )


SPANS = Layout(
    "spans",
    (
        Column("trace_id", pa.string(), "32 lowercase hex", not_null=True),
        Column("span_id", pa.string(), "16 lowercase hex", not_null=True),
        Column("parent_span_id", pa.string(), "NULL for a root span"),
        Column("trace_state", pa.string()),
        Column("flags", pa.uint32()),
        Column("name", pa.string()),
        Column(
            "kind",
            pa.int8(),
            "OTLP SpanKind: 0 unspecified, 1 internal, 2 server, 3 client, 4 producer, 5 consumer",
        ),
        Column("start_time_unix_nano", pa.uint64()),
        Column("end_time_unix_nano", pa.uint64()),
        Column(
            "attributes",
            JSON,
            "every attribute but the content ones; with content_attributes, all the span's attributes",
        ),
        Column(
            "content_attributes",
            JSON,
            "the attributes carrying a call's content (messages, request and response bodies, tool"
            " definitions: otel_rl/collector/flatten.py CONTENT_ATTRIBUTES), NULL when none",
        ),
        Column("dropped_attributes_count", pa.uint32()),
        Column("events", JSON, '[{"time_unix_nano", "name", "attributes", "dropped_attributes_count"}]'),
        Column("dropped_events_count", pa.uint32()),
        Column(
            "links",
            JSON,
            '[{"trace_id", "span_id", "trace_state", "attributes", "dropped_attributes_count", "flags"}]',
        ),
        Column("dropped_links_count", pa.uint32()),
        Column("status_code", pa.int8(), "0 unset, 1 ok, 2 error"),
        Column("status_message", pa.string()),
        *_identity(),
        *_origin(),
        _received_at(),
        _commit_seq(),
        _sender(),
    ),
    key=("trace_id", "span_id"),
    sent_time="start_time_unix_nano",
)

CALL_TOKENS = Layout(
    "call_tokens",
    (
        Column("trace_id", pa.string(), "its span's", not_null=True),
        Column("span_id", pa.string(), "its span's", not_null=True),
        Column("prompt_token_ids", pa.list_(pa.int32()), "otel_rl.prompt_token_ids, decoded at ingest"),
        Column("choice_token_ids", pa.list_(pa.list_(pa.int32())), "one list per choice, by choice index"),
        Column(
            "choice_logprobs",
            pa.list_(pa.list_(pa.float32())),
            "sampled-token logprobs, aligned with choice_token_ids",
        ),
        Column("received_at", RECEIVED_AT, "as its span's"),
        _commit_seq(),
        _sender(),
    ),
    key=("trace_id", "span_id"),
)

LOGS = Layout(
    "logs",
    (
        Column(
            "content_key",
            pa.string(),
            "hash of the record with its resource and scope: the dedup key",
            not_null=True,
        ),
        Column("seq", pa.uint64(), "ingest order (records of one request keep their order)"),
        Column("time_unix_nano", pa.uint64(), "0 when the exporter sent none (common: use observed time)"),
        Column("observed_time_unix_nano", pa.uint64()),
        Column("severity_number", pa.int32()),
        Column("severity_text", pa.string()),
        Column("event_name", pa.string()),
        Column("body", JSON),
        Column("attributes", JSON),
        Column("dropped_attributes_count", pa.uint32()),
        Column("flags", pa.uint32()),
        Column("trace_id", pa.string(), "NULL when absent"),
        Column("span_id", pa.string(), "NULL when absent"),
        *_identity(),
        *_origin(),
        _received_at(),
        _commit_seq(),
        _sender(),
    ),
    key=("content_key",),
    sent_time="time_unix_nano",
)

METRIC_POINTS = Layout(
    "metric_points",
    (
        Column(
            "content_key", pa.string(), "hash of the point with its metric, resource and scope", not_null=True
        ),
        Column("metric_name", pa.string()),
        Column("description", pa.string()),
        Column("unit", pa.string()),
        Column("metric_metadata", JSON),
        Column("type", pa.string(), "gauge | sum | histogram | exponential_histogram | summary"),
        Column("aggregation_temporality", pa.int8()),
        Column("is_monotonic", pa.bool_()),
        Column("start_time_unix_nano", pa.uint64()),
        Column("time_unix_nano", pa.uint64()),
        Column("attributes", JSON),
        Column("value", pa.float64(), "gauge / sum points"),
        Column("count", pa.uint64(), "histogram / summary points"),
        Column("sum", pa.float64()),
        Column("min", pa.float64()),
        Column("max", pa.float64()),
        Column("point", JSON, "the whole data point (buckets, quantiles, exemplars, flags)"),
        *_identity(),
        *_origin(dropped_resource=False),
        _received_at(),
        _sender(),
    ),
    key=("content_key",),
    sent_time="time_unix_nano",
)

ROLLOUT_KEYS = Layout(
    "rollout_keys",
    (
        Column("key_hash", pa.string(), "sha256 of the key: the key itself is never stored", not_null=True),
        Column("rollout_id", pa.string(), not_null=True),
        Column("created_at", RECEIVED_AT, not_null=True),
        Column("attempt_id", pa.string(), "the one attempt the key acts for (NULL: keys of older stores)"),
        Column("identity", JSON, "the otel_rl.* identity its calls and records are attributed to"),
        Column("expires_at", RECEIVED_AT, "after this it is refused (NULL: keys of older stores)"),
    ),
    key=("key_hash",),
)

ROLLOUT_KEY_REVOCATIONS = Layout(
    "rollout_key_revocations",
    (
        Column("key_hash", pa.string(), "the rollout key refused from now on", not_null=True),
        Column("reason", pa.string(), "why: its attempt ended or was superseded, or the admin revoked it"),
        Column("revoked_at", RECEIVED_AT, not_null=True),
    ),
    key=("key_hash",),  # the first revocation of a key is the one kept
)

ARCHIVE_FILES = Layout(
    "archive_files",
    (
        Column(
            "path",
            pa.string(),
            "relative to the store's folder: <store>.archive/<raw_table>/day=YYYY-MM-DD/<name>.parquet",
            not_null=True,
        ),
        Column("raw_table", pa.string(), "the raw table whose rows it holds", not_null=True),
        Column("day", pa.date32(), "the day (UTC) its rows were received", not_null=True),
        Column("rows", pa.uint64(), not_null=True),
        Column("bytes", pa.uint64(), "the file's size", not_null=True),
        Column("min_commit_seq", pa.uint64(), "of its rows (NULL for metric_points)"),
        Column("max_commit_seq", pa.uint64(), "of its rows (NULL for metric_points)"),
        Column("archived_at", RECEIVED_AT, not_null=True),
    ),
)

# Coding tasks' public fields (`otel-rl tasks load`, docs/coding.md): the hidden tests and the gold patch stay
# in the task file, never in the store a query reads.
TASKS = Layout(
    "tasks",
    (
        Column("task_set", pa.string(), "the set it was loaded as (the task file's stem unless named)", True),
        Column("instance_id", pa.string(), not_null=True),
        Column("repo", pa.string(), "the upstream repository"),
        Column("base_commit", pa.string()),
        Column("problem_statement", pa.string()),
        Column("fail_to_pass", pa.list_(pa.string()), "FAIL_TO_PASS: pytest node ids"),
        Column("pass_to_pass", pa.list_(pa.string()), "PASS_TO_PASS: pytest node ids"),
        Column("task_file", pa.string(), "the task file's absolute path when loaded"),
        Column("task_sha256", pa.string(), "of the whole task, grader-side fields too: its version", True),
        _received_at(),
        _sender(),
        _commit_seq(),
    ),
    key=("task_set", "instance_id", "task_sha256"),  # loading the same file again adds nothing
)

RAW_TABLES = (SPANS, CALL_TOKENS, LOGS, METRIC_POINTS)
KEY_TABLES = (ROLLOUT_KEYS, ROLLOUT_KEY_REVOCATIONS)
TASK_TABLES = (TASKS,)
LAYOUTS = {layout.table: layout for layout in (*RAW_TABLES, *KEY_TABLES, *TASK_TABLES, ARCHIVE_FILES)}
