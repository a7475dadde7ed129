"""OTLP/HTTP receiver: real captured exports through a real `otel-rl serve`, bad input, dedup, scoping."""

import gzip
import json
import os
import zlib
from datetime import UTC, datetime

import httpx
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from otel_fixtures import CapturedRequest, captured_requests

from otel_rl.attributes import ROLLOUT_ID
from otel_rl.collector import flatten, metrics

CAPTURED = captured_requests()
NOW = datetime.now(UTC)
TABLES = {"traces": "spans", "logs": "logs", "metrics": "metric_points"}


def post(
    server, path: str, body: bytes, headers: dict[str, str], *, token: str | None = "default"
) -> httpx.Response:
    auth = server.auth if token == "default" else ({"Authorization": f"Bearer {token}"} if token else {})
    return httpx.post(f"{server.http_url}{path}", content=body, headers={**headers, **auth}, timeout=60)


def spans_request(n: int, *, rollout_ids: list[str | None] | None = None, parent_of: bytes = b"") -> tuple:
    """A trace request with n spans of one new trace; returns (request, trace id hex)."""
    trace_id = os.urandom(16)
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    for i in range(n):
        span = spans.add(trace_id=trace_id, span_id=os.urandom(8), name=f"span {i}", parent_span_id=parent_of)
        span.start_time_unix_nano = 1_700_000_000_000_000_000 + i
        rollout_id = rollout_ids[i] if rollout_ids else None
        if rollout_id is not None:
            span.attributes.add(key=ROLLOUT_ID).value.string_value = rollout_id
    return request, trace_id.hex()


def stored_spans(server, trace_id: str) -> int:
    return server.scalar(f"SELECT count(*) FROM spans WHERE trace_id = '{trace_id}'")


@pytest.mark.parametrize("captured", CAPTURED, ids=[c.name for c in CAPTURED])
def test_every_captured_export_is_stored_in_its_real_encoding(
    otel_rl_server, captured: CapturedRequest
) -> None:
    response = post(otel_rl_server, f"/v1/{captured.signal}", captured.body, captured.headers)

    assert response.status_code == 200, response.text
    if captured.content_type == "application/json":
        assert response.headers["content-type"] == "application/json" and response.json() == {}
    else:
        assert response.headers["content-type"] == "application/x-protobuf" and response.content == b""
    assert stored_count(otel_rl_server, captured) == captured.record_count()


def stored_count(server, captured: CapturedRequest) -> int:
    """How many of the captured request's records the store holds, matched by their dedup keys."""
    if captured.signal == "traces":
        table, key = flatten.traces_to_tables(captured.decoded, NOW, "admin")["spans"], "trace_id || span_id"
    elif captured.signal == "logs":
        table, key = flatten.logs_to_tables(captured.decoded, NOW, 0, "admin")["logs"], "content_key"
    else:
        table, key = metrics.metrics_to_tables(captured.decoded, NOW, "admin")["metric_points"], "content_key"
    keys = table.column("content_key" if key == "content_key" else "trace_id").to_pylist()
    if key != "content_key":
        keys = [t + s for t, s in zip(keys, table.column("span_id").to_pylist(), strict=True)]
    assert len(set(keys)) == len(keys), "the capture holds identical records"
    listed = ", ".join(f"'{k}'" for k in keys)
    return server.scalar(f"SELECT count(*) FROM {TABLES[captured.signal]} WHERE {key} IN ({listed})")


def assert_refused(response: httpx.Response, status: int, message_part: str) -> None:
    assert response.status_code == status, response.text
    if response.headers["content-type"] == "application/x-protobuf":
        message = status_pb2.Status.FromString(response.content).message
    else:
        message = response.json()["message"]
    assert message_part in message


PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}
BAD_INPUT = {
    "truncated protobuf": (
        lambda body: body[: len(body) - 7],
        PROTOBUF,
        400,
        "protobuf ExportTraceServiceRequest could not be parsed",
    ),
    "wrong content type": (
        lambda body: body,
        {"Content-Type": "text/plain"},
        415,
        "unsupported content type",
    ),
    "unknown content encoding": (
        lambda body: body,
        {**PROTOBUF, "Content-Encoding": "br"},
        415,
        "content encoding",
    ),
    "corrupt gzip": (
        lambda body: b"this is not gzip" + body,
        {**PROTOBUF, "Content-Encoding": "gzip"},
        400,
        "gzip body is corrupt",
    ),
    "truncated gzip": (
        lambda body: gzip.compress(body)[:-20],
        {**PROTOBUF, "Content-Encoding": "gzip"},
        400,
        "gzip body is truncated",
    ),
    "invalid JSON": (lambda body: b'{"resourceSpans": [', JSON, 400, "invalid JSON at line 1 column 20"),
    "JSON of the wrong shape": (
        lambda body: b'{"resourceSpans": {"spans": 3}}',
        JSON,
        400,
        "OTLP/JSON ExportTraceServiceRequest could not be parsed",
    ),
    "JSON with a non-hex span id": (
        lambda body: (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "'
            + b"z" * 32
            + b'", "spanId": "0102030405060708"}]}]}]}'
        ),
        JSON,
        400,
        "traceId",
    ),
    "gzip bomb": (
        lambda body: gzip.compress(b"\0" * (64 * 1024 * 1024 + 1)),
        {**PROTOBUF, "Content-Encoding": "gzip"},
        413,
        "decompressed gzip body is over the limit",
    ),
    "body over the limit": (lambda body: b"\0" * (64 * 1024 * 1024 + 1), PROTOBUF, 413, "is over the limit"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_gets_its_status_and_a_clear_message_and_stores_nothing(otel_rl_server, case: str) -> None:
    mangle, headers, status, message = BAD_INPUT[case]
    request, trace_id = spans_request(3)
    before = otel_rl_server.counts()

    response = post(otel_rl_server, "/v1/traces", mangle(request.SerializeToString()), headers)

    assert_refused(response, status, message)
    assert otel_rl_server.counts() == before
    assert stored_spans(otel_rl_server, trace_id) == 0


@pytest.mark.parametrize(
    ("token", "message"), [(None, "missing bearer token"), ("wrong-token", "unknown bearer token")]
)
def test_a_missing_or_wrong_token_gets_401_and_stores_nothing(otel_rl_server, token, message) -> None:
    request, trace_id = spans_request(2)
    before = otel_rl_server.counts()

    response = post(otel_rl_server, "/v1/traces", request.SerializeToString(), PROTOBUF, token=token)

    assert_refused(response, 401, message)
    assert otel_rl_server.counts() == before


def test_a_repeated_export_is_stored_once(otel_rl_server) -> None:
    request, trace_id = spans_request(5)
    body = request.SerializeToString()

    for _ in range(3):
        assert post(otel_rl_server, "/v1/traces", body, PROTOBUF).status_code == 200

    assert stored_spans(otel_rl_server, trace_id) == 5


def test_a_span_sent_twice_in_one_request_is_stored_once(otel_rl_server) -> None:
    request, trace_id = spans_request(4)
    spans = request.resource_spans[0].scope_spans[0].spans
    spans.add().CopyFrom(spans[0])

    assert post(otel_rl_server, "/v1/traces", request.SerializeToString(), PROTOBUF).status_code == 200

    assert stored_spans(otel_rl_server, trace_id) == 4


def test_children_sent_before_their_parent_in_another_request_join_it(otel_rl_server) -> None:
    parent_request, trace_id = spans_request(1)
    parent = parent_request.resource_spans[0].scope_spans[0].spans[0]
    children = ExportTraceServiceRequest()
    for i in range(3):
        children.resource_spans.add().scope_spans.add().spans.add(
            trace_id=parent.trace_id, span_id=os.urandom(8), parent_span_id=parent.span_id, name=f"child {i}"
        )

    assert post(otel_rl_server, "/v1/traces", children.SerializeToString(), PROTOBUF).status_code == 200
    assert post(otel_rl_server, "/v1/traces", parent_request.SerializeToString(), PROTOBUF).status_code == 200

    joined = otel_rl_server.scalar(
        "SELECT count(*) FROM spans c JOIN spans p USING (trace_id) WHERE c.parent_span_id = p.span_id"
        f" AND trace_id = '{trace_id}'"
    )
    assert joined == 3


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [("deflate", zlib.compress), ("deflate", lambda b: zlib.compress(b)[2:-4]), ("gzip", gzip.compress)],
    ids=["zlib deflate", "raw deflate", "gzip"],
)
def test_compressed_bodies_are_accepted(otel_rl_server, encoding, compress) -> None:
    request, trace_id = spans_request(3)
    headers = {**PROTOBUF, "Content-Encoding": encoding}

    response = post(otel_rl_server, "/v1/traces", compress(request.SerializeToString()), headers)

    assert response.status_code == 200, response.text
    assert ExportTraceServiceResponse.FromString(response.content) == ExportTraceServiceResponse()
    assert stored_spans(otel_rl_server, trace_id) == 3


def test_concurrent_exports_are_all_stored(otel_rl_server) -> None:
    from concurrent.futures import ThreadPoolExecutor

    requests = [spans_request(50) for _ in range(16)]
    with ThreadPoolExecutor(8) as pool:
        statuses = list(
            pool.map(
                lambda r: post(otel_rl_server, "/v1/traces", r[0].SerializeToString(), PROTOBUF).status_code,
                requests,
            )
        )

    assert statuses == [200] * 16
    assert [stored_spans(otel_rl_server, trace_id) for _, trace_id in requests] == [50] * 16


def test_the_real_otel_http_exporter_exports_to_the_server(otel_rl_server) -> None:
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    exporter = OTLPSpanExporter(
        endpoint=f"{otel_rl_server.http_url}/v1/traces",
        headers=otel_rl_server.auth,
        compression=Compression.Gzip,
    )
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("test").start_as_current_span("exported over http") as span:
        trace_id = format(span.get_span_context().trace_id, "032x")
    provider.shutdown()

    assert (
        otel_rl_server.scalar(f"SELECT name FROM spans WHERE trace_id = '{trace_id}'") == "exported over http"
    )


def test_a_posted_reward_is_stored_as_an_evaluation_log_record(otel_rl_server) -> None:
    rollout_id = f"rollout-{os.urandom(4).hex()}"
    reward = {"rollout_id": rollout_id, "value": 0.75, "label": "pass", "span_id": "00f067aa0ba902b7"}

    response = httpx.post(f"{otel_rl_server.http_url}/v1/rewards", json=reward, headers=otel_rl_server.auth)

    assert response.status_code == 200, response.text
    row = otel_rl_server.sql(
        "SELECT event_name, scope_name, span_id, attributes FROM logs"
        f" WHERE attributes->>'$.\"otel_rl.rollout.id\"' = '{rollout_id}'"
    ).to_pylist()
    assert len(row) == 1
    assert row[0]["event_name"] == "gen_ai.evaluation.result"
    assert row[0]["scope_name"] == "otel_rl.rewards_api"
    assert row[0]["span_id"] == "00f067aa0ba902b7"
    assert json.loads(row[0]["attributes"]) == {
        "otel_rl.rollout.id": rollout_id,
        "gen_ai.evaluation.name": "outcome",
        "gen_ai.evaluation.score.value": 0.75,
        "gen_ai.evaluation.score.label": "pass",
        "otel_rl.reward.source": "grader",
    }


def test_a_reward_without_the_admin_token_or_with_a_bad_span_id_is_refused(otel_rl_server) -> None:
    url = f"{otel_rl_server.http_url}/v1/rewards"
    before = otel_rl_server.counts()

    assert httpx.post(url, json={"rollout_id": "r", "value": 1.0}).status_code == 401
    bad_span = httpx.post(
        url, json={"rollout_id": "r", "value": 1, "span_id": "xyz"}, headers=otel_rl_server.auth
    )
    assert bad_span.status_code == 422 and "span_id must be 16 hex digits" in bad_span.text
    assert otel_rl_server.counts() == before


def test_a_packed_token_attribute_of_the_wrong_length_is_refused_with_400(otel_rl_server) -> None:
    request, trace_id = spans_request(2)
    span = request.resource_spans[0].scope_spans[0].spans[1]
    span.attributes.add(key="otel_rl.prompt_token_ids").value.bytes_value = b"\x01\x00\x00\x00\x02"
    before = otel_rl_server.counts()

    response = post(otel_rl_server, "/v1/traces", request.SerializeToString(), PROTOBUF)

    assert_refused(response, 400, "not a whole number of 4-byte little-endian values")
    assert otel_rl_server.counts() == before
