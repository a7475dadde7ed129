"""Any store file name works: names that clash with the views' table aliases, spaces, quotes."""

import json
import os
import time
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otel_rl_server import ServerProcess
from test_store_faults import PROTOBUF


def chat_span_request() -> tuple[bytes, str]:
    """One GenAI chat span (latest semconv attributes) in a new trace."""
    trace_id = os.urandom(16)
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    span = spans.add(trace_id=trace_id, span_id=os.urandom(8), name="chat tiny", kind=3)
    span.start_time_unix_nano = time.time_ns()
    span.end_time_unix_nano = span.start_time_unix_nano + 1_000_000
    messages = [{"role": "user", "parts": [{"type": "text", "content": "hello"}]}]
    for key, value in {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "tiny",
        "gen_ai.input.messages": json.dumps(messages),
    }.items():
        span.attributes.add(key=key).value.string_value = value
    return request.SerializeToString(), trace_id.hex()


@pytest.mark.parametrize("name", ["c.duckdb", "t.duckdb", "a.duckdb", "my store.duckdb", "o'brien.duckdb"])
def test_a_store_of_any_file_name_has_every_view_and_answers_llm_calls(tmp_path: Path, name: str) -> None:
    server = ServerProcess(tmp_path / name, tmp_path).start()
    try:
        health = httpx.get(f"{server.http_url}/healthz", headers=server.auth, timeout=10).json()
        body, trace_id = chat_span_request()
        exported = httpx.post(
            f"{server.http_url}/v1/traces", content=body, headers={**PROTOBUF, **server.auth}, timeout=30
        )
        calls = server.scalar(f"SELECT count(*) FROM llm_calls WHERE trace_id = '{trace_id}'")
        operation = server.scalar(f"SELECT operation FROM llm_calls WHERE trace_id = '{trace_id}'")
    finally:
        server.stop()
    assert health["views"] and all(error is None for error in health["views"].values()), health["views"]
    assert exported.status_code == 200, exported.text
    assert (calls, operation) == (1, "chat")
