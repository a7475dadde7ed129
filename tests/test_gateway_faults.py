"""Faults behind the gateway (injected by a vLLM-style fake): a clear error for the client, a failed span."""

import asyncio
import socket
import time
import uuid
from collections.abc import Iterator

import openai
import pytest
from fake_vllm import MODEL, FakeVLLM, Fault
from gateway_server import ADMIN_TOKEN, GatewayServer
from opentelemetry.sdk.trace import TracerProvider

from otel_rl.gateway.client import UpstreamClient
from otel_rl.gateway.reload import GatewayPaused, ReloadCoordinator
from otel_rl.gateway.servers import ServerPool

UPSTREAM_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeVLLM]:
    with FakeVLLM() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(fake: FakeVLLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    db = tmp_path_factory.mktemp("gateway_faults") / "store.duckdb"
    with GatewayServer(db, vllm=[fake.base_url], upstream_timeout_s=UPSTREAM_TIMEOUT_S) as server:
        yield server


def call(gateway: GatewayServer, *, stream: bool = False) -> tuple[str, object]:
    rollout = f"rollout-{uuid.uuid4().hex[:12]}"
    headers = {"x-otel-rl-rollout-id": rollout}
    client = openai.OpenAI(base_url=gateway.url, api_key=ADMIN_TOKEN, max_retries=0, default_headers=headers)
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], stream=stream, max_tokens=20
    )
    return rollout, response


def failed_span(gateway: GatewayServer, rollout: str) -> dict:
    [span] = gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{rollout}'")
    assert span["status_code"] == 2, "the span is not marked as failed"
    return span


def test_error_status_from_vllm_reaches_the_client_as_is(gateway, fake):
    fake.inject(Fault(status=500, message="engine crashed"))
    with pytest.raises(openai.InternalServerError, match="engine crashed") as raised:
        call(gateway)
    rollout = raised.value.request.headers["x-otel-rl-rollout-id"]
    span = failed_span(gateway, rollout)
    assert span["attributes"]["error.type"] == "500"
    assert span["status_message"] == "engine crashed"


def test_vllm_that_does_not_answer_in_time_gives_a_504(gateway, fake):
    fake.inject(Fault(delay_s=UPSTREAM_TIMEOUT_S + 1))
    with pytest.raises(openai.InternalServerError, match="did not answer in time") as raised:
        call(gateway)
    assert raised.value.status_code == 504
    span = failed_span(gateway, raised.value.request.headers["x-otel-rl-rollout-id"])
    assert span["attributes"]["error.type"] == "upstream_timeout"


def test_vllm_dropping_the_connection_before_answering_gives_a_502(gateway, fake):
    fake.inject(Fault(disconnect_after_chunks=0))
    with pytest.raises(openai.InternalServerError, match="failed mid-call") as raised:
        call(gateway)
    assert raised.value.status_code == 502
    span = failed_span(gateway, raised.value.request.headers["x-otel-rl-rollout-id"])
    assert span["attributes"]["error.type"] == "upstream_disconnected"


def test_vllm_dropping_a_stream_midway_ends_it_with_an_error_event(gateway, fake):
    fake.inject(Fault(disconnect_after_chunks=3))
    rollout, stream = call(gateway, stream=True)
    received = []
    with pytest.raises(openai.APIError, match="failed mid-call"):
        for chunk in stream:
            received.append(chunk)
    assert received, "the chunks before the disconnect were relayed"
    span = failed_span(gateway, rollout)
    assert span["attributes"]["error.type"] == "upstream_disconnected"
    assert span["choice_token_ids"] is not None  # what arrived before the cut is kept


def test_server_that_stays_down_gives_a_503_naming_it_at_the_calls_deadline(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, never listening: connections are refused
        store = tmp_path / "store.duckdb"
        with GatewayServer(store, vllm=[url], upstream_timeout_s=UPSTREAM_TIMEOUT_S) as gateway:
            start = time.monotonic()
            with pytest.raises(openai.InternalServerError, match="no inference server available") as raised:
                call(gateway)
            assert UPSTREAM_TIMEOUT_S <= time.monotonic() - start < UPSTREAM_TIMEOUT_S + 2
            assert raised.value.status_code == 503
            assert raised.value.response.headers["retry-after"] == "1"
            assert url in str(raised.value)
            assert "Connect call failed" in str(raised.value)  # why: the connection was refused
            assert f"waited {UPSTREAM_TIMEOUT_S:g} s (--upstream-timeout)" in str(raised.value)
            span = failed_span(gateway, raised.value.request.headers["x-otel-rl-rollout-id"])
            assert span["attributes"]["error.type"] == "ServiceUnavailableError"


def test_call_waiting_longer_than_the_bound_for_a_reload_is_refused_and_the_stuck_server_taken_out():
    async def scenario() -> None:
        stuck = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)  # never answers
        url = f"http://127.0.0.1:{stuck.sockets[0].getsockname()[1]}"
        client = UpstreamClient(connect_timeout_s=1, read_timeout_s=1)
        await client.start()
        coordinator = ReloadCoordinator(
            ServerPool((url,)),
            client,
            TracerProvider().get_tracer("test"),
            pause_wait_s=0.05,
            drain_timeout_s=1,
            reload_timeout_s=0.5,
        )
        reload = asyncio.create_task(coordinator.reload(version=1, checkpoint="/ckpt", lora_adapter=None))
        deadline = time.monotonic() + 10
        while not coordinator.busy:  # until the reload holds the gate (its /pause then hangs)
            assert time.monotonic() < deadline, "the reload never started"
            await asyncio.sleep(0.005)
        with pytest.raises(GatewayPaused) as raised:
            await coordinator.admit()
        assert raised.value.retry_after_s == 1
        result = await reload
        assert [(s.ok, s.error.split(":")[0]) for s in result.servers] == [(False, "UpstreamError")]
        assert "timeout" in result.servers[0].error
        assert coordinator.policy.version == 0  # no server took the new weights: nothing switched
        assert not coordinator.pool.servers[0].available
        await client.close()
        stuck.close()

    asyncio.run(scenario())
