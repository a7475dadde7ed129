"""Tokens: rollout keys survive restarts and may export only their own rollout's records."""

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from otel_rl_server import ServerProcess
from test_collector_http import PROTOBUF, spans_request

from otel_rl.attributes import ROLLOUT_ID
from otel_rl.auth import Auth, bearer
from otel_rl.store import Store


def test_a_rollout_key_survives_a_restart_and_exports_only_its_own_rollout(tmp_path) -> None:
    db = tmp_path / "otel_rl.duckdb"
    with Store(db) as store:
        key = Auth(store, "admin-token").issue_rollout_key("rollout-1")
    request, trace_id = spans_request(4, rollout_ids=["rollout-1", "rollout-2", None, "rollout-1"])
    foreign_resource = request.resource_spans.add(resource=Resource())
    foreign_resource.resource.attributes.add(key=ROLLOUT_ID).value.string_value = "rollout-2"
    foreign_resource.scope_spans.add().spans.add().CopyFrom(request.resource_spans[0].scope_spans[0].spans[2])
    foreign_resource.scope_spans[0].spans[0].span_id = b"\x01" * 8

    server = ServerProcess(db, tmp_path, token="admin-token").start()
    try:
        headers = {**PROTOBUF, "Authorization": f"Bearer {key}"}
        response = httpx.post(
            f"{server.http_url}/v1/traces", content=request.SerializeToString(), headers=headers
        )

        assert response.status_code == 200, response.text
        partial = ExportTraceServiceResponse.FromString(response.content).partial_success
        assert partial.rejected_spans == 2
        assert "another rollout than this key's ('rollout-1')" in partial.error_message
        stored = server.sql(f"SELECT name FROM spans WHERE trace_id = '{trace_id}' ORDER BY name").column(0)
        assert stored.to_pylist() == ["span 0", "span 2", "span 3"]

        key_auth = {"Authorization": f"Bearer {key}"}
        reward = httpx.post(
            f"{server.http_url}/v1/rewards", json={"rollout_id": "rollout-1", "value": 1.0}, headers=key_auth
        )
        assert reward.status_code == 403 and "admin token" in reward.json()["detail"]
        query = httpx.post(f"{server.http_url}/v1/query", json={"sql": "SELECT 1"}, headers=key_auth)
        assert query.status_code == 403
    finally:
        server.stop()
    assert not db.with_name(db.name + ".wal").exists(), "a clean shutdown checkpoints the WAL into the file"


def test_a_bearer_header_left_percent_encoded_by_a_javascript_exporter_is_read() -> None:
    # OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%20<key>: Claude Code's and opencode's exporters send the
    # value as written
    assert bearer("Bearer%20k-123") == bearer("Bearer k-123") == "k-123"
    assert bearer("Basic%20k-123") is None and bearer("Bearer%20") is None
