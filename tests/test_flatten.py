"""OTLP requests -> raw-table Arrow rows: the store's column types, attribute JSON, packed token arrays."""

import json
from datetime import UTC, datetime

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_fixtures import captured_requests

from otel_rl.collector.flatten import logs_to_tables, traces_to_tables
from otel_rl.collector.metrics import metrics_to_tables
from otel_rl.store.identity import rollout_key_identity
from otel_rl.store.layout import LAYOUTS, RAW_TABLES

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture
def db() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    for layout in RAW_TABLES:
        con.execute(layout.ddl())
    return con


def insert(con: duckdb.DuckDBPyConnection, tables: dict[str, pa.Table]) -> None:
    """Insert by position (the columns the store's writer does not set): a column in the wrong place or of the
    wrong type fails here."""
    for name, table in tables.items():
        con.register("incoming", table)
        con.execute(f"INSERT INTO {name} ({', '.join(table.schema.names)}) SELECT * FROM incoming")
        con.unregister("incoming")


def sdk_request(*spans: tuple[str, dict]) -> object:
    """An ExportTraceServiceRequest encoded by the OTel SDK from real spans (name, attributes)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("otel_rl.gateway")
    for name, attributes in spans:
        tracer.start_span(name, attributes=attributes).end()
    return encode_spans(exporter.get_finished_spans())


def test_tables_have_the_columns_and_types_of_the_store_tables(db) -> None:
    tables = traces_to_tables(sdk_request(("chat m", {"gen_ai.operation.name": "chat"})), NOW, "admin")
    tables |= logs_to_tables(ExportLogsServiceRequest(), NOW, 0, "admin")
    tables |= metrics_to_tables(ExportMetricsServiceRequest(), NOW, "admin")
    for name, table in tables.items():
        built = ", ".join(column.name for column in LAYOUTS[name].built)  # not what the writer sets
        expected = db.sql(f"SELECT {built} FROM {name} LIMIT 0").to_arrow_table().schema
        sql_types = dict(
            db.execute(
                f"SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = '{name}'"
            ).fetchall()
        )
        assert table.schema.names == expected.names, name
        for field in table.schema:
            want = expected.field(field.name).type
            if sql_types[field.name] == "JSON":  # Arrow's JSON type: DuckDB stores it without re-parsing
                assert field.type == pa.json_(), (name, field.name)
            elif pa.types.is_timestamp(want):  # DuckDB names UTC "Etc/UTC"
                assert field.type.unit == want.unit and field.type.tz in ("UTC", "Etc/UTC"), field.name
            else:
                assert field.type == want, (name, field.name)


def test_packed_token_arrays_round_trip_exactly_into_call_tokens(db) -> None:
    rng = np.random.default_rng(7)
    prompt = rng.integers(-(2**31), 2**31 - 1, 1000, dtype="<i4")
    choices = [rng.integers(0, 200_000, n, dtype="<i4") for n in (5, 0, 300)]
    logprobs = [-rng.random(len(ids), dtype="<f4") for ids in choices]
    logprobs[2][7] = -np.inf  # vLLM reports -inf for tokens it could not have sampled
    attributes = {"otel_rl.prompt_token_ids": prompt.tobytes(), "gen_ai.operation.name": "chat"}
    for i, (ids, lps) in enumerate(zip(choices, logprobs, strict=True)):
        attributes[f"otel_rl.choices.{i}.token_ids"] = ids.tobytes()
        attributes[f"otel_rl.choices.{i}.logprobs"] = lps.tobytes()
    tables = traces_to_tables(sdk_request(("chat m", attributes), ("other", {"a": 1})), NOW, "admin")
    insert(db, tables)

    (row,) = db.execute(
        "SELECT prompt_token_ids, choice_token_ids, choice_logprobs FROM call_tokens"
    ).fetchall()
    assert row[0] == prompt.tolist()
    assert row[1] == [ids.tolist() for ids in choices]
    assert [np.array(lps, dtype="<f4").tobytes() for lps in row[2]] == [lps.tobytes() for lps in logprobs]
    (span_attributes,) = db.execute("SELECT attributes FROM spans WHERE name = 'chat m'").fetchone()
    assert json.loads(span_attributes) == {"gen_ai.operation.name": "chat"}  # packed arrays moved out


def test_content_attributes_are_stored_apart_and_together_with_the_rest_are_every_attribute(db) -> None:
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "m",
        "gen_ai.input.messages": '[{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]',
        "gen_ai.system_instructions": "[]",
        "input.value": "{}",
        "llm.input_messages.0.message.content": "hi",
        "llm.tools.0.tool.json_schema": "{}",
        "gen_ai.usage.input_tokens": 3,
    }
    insert(db, traces_to_tables(sdk_request(("chat m", attributes), ("tool t", {"a": 1})), NOW, "admin"))

    rows = db.execute("SELECT name, attributes, content_attributes FROM spans ORDER BY name").fetchall()
    (_, call, content), (_, tool, no_content) = rows
    assert json.loads(call) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "m",
        "gen_ai.usage.input_tokens": 3,
    }
    assert json.loads(call) | json.loads(content) == attributes
    assert (json.loads(tool), no_content) == ({"a": 1}, None)


def test_an_unrecorded_choice_or_prompt_or_logprobs_is_null(db) -> None:
    ids = np.arange(4, dtype="<i4")
    request = sdk_request(("chat m", {"otel_rl.choices.1.token_ids": ids.tobytes()}))
    insert(db, traces_to_tables(request, NOW, "admin"))
    row = db.execute("SELECT prompt_token_ids, choice_token_ids, choice_logprobs FROM call_tokens").fetchone()
    assert row == (None, [None, [0, 1, 2, 3]], None)


def test_a_packed_array_that_is_not_whole_int32_values_is_refused_by_name() -> None:
    request = sdk_request(("chat m", {"otel_rl.prompt_token_ids": b"\x01\x02\x03"}))
    with pytest.raises(ValueError, match=r"'otel_rl.prompt_token_ids' has 3 bytes"):
        traces_to_tables(request, NOW, "admin")


def test_attribute_values_map_to_json_and_ids_to_lowercase_hex(db) -> None:
    attributes = {
        "s": 'é "quoted"',
        "i": 2**62,
        "f": 0.25,
        "b": True,
        # zeros and the empty string: the values a oneof read cannot tell from an unset field
        "i0": 0,
        "f0": 0.0,
        "b0": False,
        "s0": "",
        "raw": b"\x00\xff",
        "list": ["a", "b"],
        "otel_rl.other_bytes": b"\x01",  # an otel_rl.* bytes value that is no token array stays an attribute
    }
    request = sdk_request(("root", attributes))
    request.resource_spans[0].scope_spans[0].spans[0].events.add(name="e", time_unix_nano=5)
    insert(db, traces_to_tables(request, NOW, "admin"))
    row = db.execute(
        "SELECT trace_id, span_id, parent_span_id, attributes, events, links, received_at FROM spans"
    ).fetchone()
    span = request.resource_spans[0].scope_spans[0].spans[0]
    assert row[:3] == (span.trace_id.hex(), span.span_id.hex(), None)
    stored = json.loads(row[3])
    assert stored == attributes | {"raw": "AP8=", "otel_rl.other_bytes": "AQ=="}
    assert [type(stored[key]) for key in ("i", "f", "b", "i0", "f0", "b0")] == [int, float, bool] * 2
    assert json.loads(row[4]) == [
        {"time_unix_nano": 5, "name": "e", "attributes": {}, "dropped_attributes_count": 0}
    ]
    assert json.loads(row[5]) == []
    assert row[6] == NOW


def test_every_captured_request_flattens_into_the_schema(db) -> None:
    seq = 0
    for captured in captured_requests():
        if captured.signal == "traces":
            tables = traces_to_tables(captured.decoded, NOW, "admin")
        elif captured.signal == "logs":
            tables = logs_to_tables(captured.decoded, NOW, seq, "admin")
            seq += tables["logs"].num_rows
        else:
            tables = metrics_to_tables(captured.decoded, NOW, "admin")
        assert (
            sum(t.num_rows for name, t in tables.items() if name != "call_tokens") == captured.record_count()
        )
        insert(db, tables)
    # content keys are unique and log records keep their request order
    assert db.execute("SELECT count(DISTINCT content_key) = count(*) FROM logs").fetchone() == (True,)
    assert db.execute("SELECT list(seq ORDER BY seq) = range(0, count(*)) FROM logs").fetchone() == (True,)
    points = dict(db.execute("SELECT type, count(*) FROM metric_points GROUP BY type").fetchall())
    assert set(points) == {"histogram", "sum"}


def test_the_same_log_record_gets_the_same_content_key_and_a_different_one_another() -> None:
    request = ExportLogsServiceRequest()
    scope_logs = request.resource_logs.add().scope_logs.add()
    scope_logs.log_records.add(event_name="a", observed_time_unix_nano=1)
    scope_logs.log_records.add(event_name="a", observed_time_unix_nano=2)
    first = logs_to_tables(request, NOW, 10, "admin")["logs"]
    again = logs_to_tables(request, NOW, 20, "admin")["logs"]
    assert first.column("content_key").to_pylist() == again.column("content_key").to_pylist()
    assert len(set(first.column("content_key").to_pylist())) == 2
    assert first.column("seq").to_pylist() == [10, 11]


IDENTITY = ("rollout_id", "attempt_id", "group_id", "task_id", "split")


def identity_rows(tables: dict[str, pa.Table], table: str) -> list[tuple]:
    return [tuple(row[c] for c in IDENTITY) for row in tables[table].select(list(IDENTITY)).to_pylist()]


def resource_request(request, resource: dict) -> object:  # noqa: ANN001 - any export request
    """`request` with `resource` as the resource attributes of its first resource."""
    target = getattr(request, request.DESCRIPTOR.fields[0].name)[0].resource.attributes
    for key, value in resource.items():
        target.add(key=key).value.string_value = value
    return request


def test_identity_columns_take_the_records_attribute_then_its_resources() -> None:
    request = resource_request(
        sdk_request(
            ("own", {"otel_rl.rollout.id": "r-span", "otel_rl.split": "val"}),
            ("unlabelled", {"gen_ai.operation.name": "chat"}),
        ),
        {"otel_rl.rollout.id": "r-resource", "otel_rl.group.id": "g-resource", "otel_rl.split": "train"},
    )
    assert identity_rows(traces_to_tables(request, NOW, "admin"), "spans") == [
        ("r-span", None, "g-resource", None, "val"),
        ("r-resource", None, "g-resource", None, "train"),
    ]
    logs = ExportLogsServiceRequest()
    records = logs.resource_logs.add().scope_logs.add().log_records
    records.add().attributes.add(key="otel_rl.attempt.id").value.string_value = "a-record"
    records.add().attributes.add(key="otel_rl.attempt.id").value.int_value = 7  # not text: no identity
    logs = resource_request(logs, {"otel_rl.rollout.id": "r-resource"})
    assert identity_rows(logs_to_tables(logs, NOW, 0, "admin"), "logs") == [
        ("r-resource", "a-record", None, None, None),
        ("r-resource", None, None, None, None),
    ]
    metrics = ExportMetricsServiceRequest()
    metric = metrics.resource_metrics.add().scope_metrics.add().metrics.add(name="m")
    metric.gauge.data_points.add(as_double=1.0).attributes.add(key="otel_rl.task.id").value.string_value = "t"
    assert identity_rows(metrics_to_tables(metrics, NOW, "admin"), "metric_points") == [
        (None, None, None, "t", None)
    ]


def test_a_rollout_keys_identity_wins_over_what_its_records_claim() -> None:
    """What reaches the flattener from a rollout key carries the key's identity, whatever a record (or its
    resource) says: the key's rollout and attempt; what the key was not issued with, the record says."""
    key = rollout_key_identity("r-key", {"otel_rl.attempt.id": "a-key"})
    request = resource_request(
        sdk_request(
            ("claims another", {"otel_rl.rollout.id": "r-victim", "otel_rl.group.id": "g-own"}),
            ("says nothing", {}),
        ),
        {"otel_rl.attempt.id": "a-victim", "otel_rl.split": "val"},
    )
    tables = traces_to_tables(request, NOW, "rollout", key)
    assert identity_rows(tables, "spans") == [
        ("r-key", "a-key", "g-own", None, "val"),
        ("r-key", "a-key", None, None, "val"),
    ]
    assert tables["spans"]["sender"].to_pylist() == ["rollout", "rollout"]
