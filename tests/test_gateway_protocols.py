"""The gateway's protocol wiring: every call records the API it came in through, and each protocol's path
answers its own error shape, through the real `otel-rl serve` in front of the vLLM-style fake."""

import json
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from fake_vllm import MODEL, FakeVLLM
from otel_rl_server import ServerProcess

from otel_rl.gateway.protocols import protocols
from otel_rl.gateway.settings import GatewaySettings


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeVLLM]:
    with FakeVLLM() as server:
        yield server


@pytest.fixture(scope="module")
def served(fake: FakeVLLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("protocols")
    server = ServerProcess(workdir / "otel_rl.duckdb", workdir, flags=("--vllm", fake.base_url)).start()
    yield server
    server.stop()


def recorded_api(server: ServerProcess, rollout_id: str, timeout_s: float = 10) -> str:
    sql = f"""SELECT attributes FROM spans WHERE scope_name = 'otel_rl.gateway'
              AND attributes->>'otel_rl.rollout.id' = '{rollout_id}'"""
    deadline = time.monotonic() + timeout_s
    while not (rows := server.sql(sql).to_pylist()) and time.monotonic() < deadline:
        time.sleep(0.05)
    [row] = rows
    return json.loads(row["attributes"])["otel_rl.gateway.api"]


@pytest.mark.parametrize(
    ("path", "body", "api"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}, "chat_completions"),
        ("/v1/completions", {"prompt": "Hi"}, "completions"),
        ("/v1/messages", {"max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}, "messages"),
        ("/v1/responses", {"input": "Hi"}, "responses"),
    ],
)
def test_each_call_records_the_api_it_came_in_through(served, path, body, api):
    rollout = f"protocols-{uuid.uuid4().hex[:12]}"
    headers = served.auth | {"x-otel-rl-rollout-id": rollout}
    response = httpx.post(
        f"{served.http_url}{path}", json={"model": MODEL, **body}, headers=headers, timeout=10
    )
    assert response.status_code == 200, response.text
    assert recorded_api(served, rollout) == api


def test_registered_protocols_name_their_api_and_answer_errors_in_their_shape(served):
    assert {path: protocol.API for path, (protocol, _) in protocols().items()} == {
        "/v1/messages": "messages",
        "/v1/responses": "responses",
    }
    anthropic = httpx.post(f"{served.http_url}/v1/messages", content=b"[]", headers=served.auth, timeout=10)
    openai = httpx.post(f"{served.http_url}/v1/responses", content=b"[]", headers=served.auth, timeout=10)
    assert anthropic.status_code == openai.status_code == 400
    assert (
        anthropic.json()["type"] == "error" and anthropic.json()["error"]["type"] == "invalid_request_error"
    )
    assert openai.json()["error"]["message"] == "the request body must be a JSON object"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
def test_a_call_body_over_the_limit_is_refused_before_it_is_read(served, path):
    limit = GatewaySettings().max_request_bytes
    declared = httpx.post(
        f"{served.http_url}{path}",
        content=b"{" + b" " * limit + b"}",
        headers=served.auth | {"content-type": "application/json"},
        timeout=30,
    )
    assert declared.status_code == 413, declared.text
    message = json.dumps(declared.json())
    assert f"over the limit of {limit} bytes" in message
    if path == "/v1/messages":
        assert declared.json()["error"]["type"] == "request_too_large"

    def chunked() -> Iterator[bytes]:  # no Content-Length: refused while reading
        yield b"{"
        for _ in range(limit // (1 << 20) + 1):
            yield b" " * (1 << 20)
        yield b"}"

    streamed = httpx.post(f"{served.http_url}{path}", content=chunked(), headers=served.auth, timeout=30)
    assert streamed.status_code == 413, streamed.text
