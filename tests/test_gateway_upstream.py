"""The gateway's `--vllm` URL forms, and a gateway that keeps serving through transient upstream trouble."""

import asyncio
import contextlib
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest
import uvicorn
from fake_vllm import MODEL, FakeVLLM
from gateway_server import ADMIN_TOKEN, GatewayServer
from loopback import ThreadedServer
from otel_rl_server import OTEL_RL, ServerProcess
from pydantic import ValidationError

from otel_rl.gateway.client import KEEPALIVE_S, UpstreamClient
from otel_rl.gateway.servers import CONNECT_FAILURES_TO_LEAVE, InferenceServer, ServerPool, retry_delay_s
from otel_rl.gateway.settings import GatewaySettings, server_root
from otel_rl.gateway.vllm import free_ports


def chat(base_url: str, rollout: str, token: str = ADMIN_TOKEN, timeout_s: float = 30) -> str:
    client = openai.OpenAI(base_url=base_url, api_key=token, max_retries=0, timeout=timeout_s)
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=20,
        extra_headers={"x-otel-rl-rollout-id": rollout},
    )
    return response.choices[0].message.content


@contextlib.contextmanager
def refusing_url() -> Iterator[str]:
    """A loopback URL whose port is bound and never listens: every connect is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def servers_state(gateway: GatewayServer) -> dict[str, bool]:
    """What `GET /v1/admin/policy` says of each server: its URL → whether it takes calls."""
    response = httpx.get(f"{gateway.base_url}/v1/admin/policy", headers=gateway.admin, timeout=10)
    return {server["url"]: server["available"] for server in response.json()["servers"]}


def without_probes(gateway: GatewayServer) -> GatewayServer:
    """No periodic health probe during the test: what it observes is the calls' doing alone."""
    gateway.gateway.settings = gateway.gateway.settings.model_copy(update={"health_interval_s": 3600})
    return gateway


# --- the URL forms ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["http://10.0.0.5:8000", "http://10.0.0.5:8000/", "http://10.0.0.5:8000/v1", "http://10.0.0.5:8000/v1/"],
)
def test_server_url_with_or_without_v1_normalizes_to_the_servers_root(url):
    assert server_root(url) == "http://10.0.0.5:8000"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("10.0.0.5:8000", "does not start with http"),
        ("localhost:8000", "does not start with http"),
        ("grpc://10.0.0.5:8000", "does not start with http"),
        ("http://:8000/v1", "names no host"),
        ("http://10.0.0.5:80000", "port is not a number"),
        ("http://10.0.0.5:8000/v1/chat/completions", "path '/v1/chat/completions'"),
        ("http://10.0.0.5:8000/v2", "path '/v2'"),
        ("http://10.0.0.5:8000/v1?api-version=1", "query"),
        ("http://10.0.0.5:8000/v1#x", "fragment"),
        ("http://user:secret@10.0.0.5:8000", "credentials"),
    ],
)
def test_server_url_that_cannot_work_is_refused_naming_the_flag_and_the_forms(url, problem):
    with pytest.raises(ValueError, match=re.escape(problem)) as raised:
        server_root(url)
    assert str(raised.value).startswith(f"--vllm {url!r}: ")
    assert "http://HOST:PORT or http://HOST:PORT/v1" in str(raised.value)


def test_gateway_settings_name_the_setting_and_what_is_wrong():
    assert GatewaySettings(servers=["http://10.0.0.5:8000/v1"]).servers == ("http://10.0.0.5:8000",)
    for given, where, problem in [
        ({"servers": ["10.0.0.5:8000"]}, "servers", "--vllm '10.0.0.5:8000': it does not start with http"),
        ({"upstream_timeout_s": 0}, "upstream_timeout_s", "greater than 0"),
        ({"split_sampling": {"train": 1.0}}, "split_sampling.train", "valid dictionary"),
        ({"upstream_timeout": 5}, "upstream_timeout", "Extra inputs are not permitted"),
    ]:
        with pytest.raises(ValidationError) as raised:
            GatewaySettings(**given)
        [error] = raised.value.errors()
        assert ".".join(map(str, error["loc"])).startswith(where) and problem in error["msg"]


def test_every_vllm_url_form_reaches_chat_completions_and_health(tmp_path):
    fakes = [FakeVLLM().start() for _ in range(4)]
    forms = [fakes[0].base_url, fakes[1].base_url + "/", fakes[2].url, fakes[3].url + "/"]
    flags = tuple(flag for form in forms for flag in ("--vllm", form))
    server = ServerProcess(tmp_path / "store.duckdb", tmp_path, flags=flags).start()
    try:
        deadline = time.monotonic() + 30
        # Rollouts spread over the servers by hashing: call until each has had calls and a health probe.
        while not all(fake.requests and fake.health_checks for fake in fakes):
            assert time.monotonic() < deadline, [(len(f.requests), f.health_checks) for f in fakes]
            assert (
                chat(f"{server.http_url}/v1", f"rollout-{uuid.uuid4().hex}", server.token) == "Fake reply 0."
            )
        assert {request.path for fake in fakes for request in fake.requests} == {"/v1/chat/completions"}
    finally:
        server.stop()
        for fake in fakes:
            fake.stop()


@pytest.mark.parametrize(
    "url",
    ["127.0.0.1:8000", "http://127.0.0.1:8000/v2", "http://127.0.0.1:8000/v1?k=1", "ftp://127.0.0.1:8000"],
)
def test_vllm_url_that_cannot_work_stops_the_server_at_start_with_a_message(url, tmp_path):
    http_port, grpc_port = free_ports(2)
    command = [str(OTEL_RL), "serve", "--db", str(tmp_path / "store.duckdb"), "--token", "t"]
    command += ["--http-port", str(http_port), "--grpc-port", str(grpc_port), "--vllm", url]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    stderr = " ".join(done.stderr.replace("│", " ").split())  # the message is wrapped in a box
    assert f"--vllm {url!r}:" in stderr
    assert "give the server's URL as http://HOST:PORT or http://HOST:PORT/v1" in stderr


def test_the_same_server_given_in_two_forms_is_refused(tmp_path):
    with pytest.raises(ValueError, match="listed twice"):
        GatewayServer(tmp_path / "store.duckdb", vllm=["http://127.0.0.1:8000", "http://127.0.0.1:8000/v1"])


# --- the pool's rules ---------------------------------------------------------------------------------


def test_a_server_leaves_the_pool_at_its_third_failed_connect_in_a_row_not_before():
    server = InferenceServer("http://127.0.0.1:1")
    assert [server.connect_failed("refused") for _ in range(CONNECT_FAILURES_TO_LEAVE)] == [
        False,
        False,
        True,
    ]
    assert not server.available and server.may_return
    assert server.state() == "http://127.0.0.1:1 (refused)"


def test_a_connect_that_succeeds_in_between_restarts_the_count():
    server = InferenceServer("http://127.0.0.1:1")
    server.connect_failed("refused")
    server.connect_failed("refused")
    server.probed(None)
    assert not server.connect_failed("refused")
    assert server.available


def test_a_failed_probe_takes_a_server_out_at_once_and_a_good_one_brings_it_back():
    server = InferenceServer("http://127.0.0.1:1")
    server.probed("GET /health answered HTTP 503")
    assert not server.available and server.state().endswith("(GET /health answered HTTP 503)")
    server.probed(None)
    assert server.available and server.consecutive_connect_failures == 0


def test_slow_health_answers_take_a_server_out_only_when_they_come_in_a_row():
    """vLLM on a busy CPU can answer /health after the probe's timeout while it serves calls: a reload in
    between found no server to reload when one slow answer took it out."""

    async def availability_after_each_probe(fake: FakeVLLM, delays: list[float]) -> list[bool]:
        pool = ServerPool((fake.base_url,))
        client = UpstreamClient(connect_timeout_s=5, read_timeout_s=5)
        await client.start()
        seen = []
        try:
            for delay_s in delays:
                fake.health_delay_s = delay_s
                await pool.probe(client, timeout_s=0.2)
                seen.append(pool.servers[0].available)
        finally:
            await client.close()
        return seen

    slow, fast = 1.0, 0.0
    with FakeVLLM() as fake:
        after = asyncio.run(availability_after_each_probe(fake, [slow, slow, fast, slow, slow, slow, fast]))
    assert CONNECT_FAILURES_TO_LEAVE == 3
    assert after == [True, True, True, True, True, False, True]


def test_connect_retries_back_off_from_50_ms_doubling_up_to_1_s():
    assert [retry_delay_s(n) for n in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


# --- transient trouble, through the gateway -----------------------------------------------------------


def test_calls_made_while_the_only_server_refuses_connections_succeed_once_it_is_back(tmp_path):
    with FakeVLLM() as fake, GatewayServer(tmp_path / "store.duckdb", vllm=[fake.base_url]) as gateway:
        assert chat(gateway.url, "rollout-before") == "Fake reply 0."  # a pooled keep-alive connection

        async def calls_during_the_outage() -> list[tuple[str, float]]:
            client = openai.AsyncOpenAI(base_url=gateway.url, api_key=ADMIN_TOKEN, max_retries=0, timeout=30)

            async def one(n: int) -> tuple[str, float]:
                start = time.monotonic()
                response = await client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "Hello"}],
                    max_tokens=20,
                    extra_headers={"x-otel-rl-rollout-id": f"rollout-{n}"},
                )
                return response.choices[0].message.content, time.monotonic() - start

            async with client:
                return await asyncio.gather(*(one(n) for n in range(16)))

        reopened = fake.refuse_connections(0.5)
        results = asyncio.run(calls_during_the_outage())
        reopened.join()
        assert [content for content, _ in results] == ["Fake reply 0."] * 16
        assert min(elapsed for _, elapsed in results) > 0.3, "the calls were made while it refused them"
        assert len(fake.requests) == 17
        assert servers_state(gateway) == {fake.base_url: True}


def test_one_refused_connect_sends_the_call_to_another_server_and_leaves_the_first_in_the_pool(tmp_path):
    with refusing_url() as down, FakeVLLM() as fake:
        gateway = without_probes(GatewayServer(tmp_path / "store.duckdb", vllm=[down, fake.base_url]))
        with gateway:
            # Rollouts whose server (by hashing) is the one that is down.
            rollouts = (f"rollout-{uuid.uuid4().hex}" for _ in range(1000))
            on_down = [r for r in rollouts if gateway.gateway.pool.pick(r).url == down][
                :CONNECT_FAILURES_TO_LEAVE
            ]
            assert chat(gateway.url, on_down[0]) == "Fake reply 0."
            assert servers_state(gateway) == {down: True, fake.base_url: True}
            for rollout in on_down[1:]:
                assert chat(gateway.url, rollout) == "Fake reply 0."
            assert servers_state(gateway) == {down: False, fake.base_url: True}
            assert len(fake.requests) == CONNECT_FAILURES_TO_LEAVE
            [span] = gateway.spans(f"attributes->>'otel_rl.rollout.id' = '{on_down[0]}'")
            assert span["attributes"]["otel_rl.server.url"] == fake.base_url
            assert span["status_code"] != 2


def test_a_server_back_up_rejoins_at_the_probe_of_the_next_call_waiting_for_it(tmp_path):
    with FakeVLLM() as fake:
        store = tmp_path / "store.duckdb"
        gateway = without_probes(GatewayServer(store, vllm=[fake.base_url], upstream_timeout_s=0.5))
        with gateway:
            port = fake.port
            fake.stop()
            with pytest.raises(openai.InternalServerError, match="waited 0.5 s"):
                chat(gateway.url, "rollout-while-down")
            assert servers_state(gateway) == {fake.base_url: False}
            fake.start(port)
            assert chat(gateway.url, "rollout-back") == "Fake reply 0."
            assert servers_state(gateway) == {fake.base_url: True}


def test_a_pooled_connection_expires_before_vllms_keep_alive_can_close_it_under_a_call():
    """vLLM's server closes a connection idle 5 s (uvicorn's keep-alive, VLLM_HTTP_TIMEOUT_KEEP_ALIVE): a call
    sent on it at that moment failed with ServerDisconnectedError. The pool reuses a connection only younger
    than that; here a uvicorn server with vLLM's keep-alive says which connection each call came on."""

    async def peer_port(scope, receive, send) -> None:  # the ASGI app: answers with the client's port
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(scope["client"][1]).encode()})

    async def ports(url: str) -> list[str]:
        client = UpstreamClient(connect_timeout_s=5, read_timeout_s=5)
        await client.start()
        seen = []
        try:
            for wait_s in (0, 0.5, KEEPALIVE_S + 0.5):
                await asyncio.sleep(wait_s)
                response = await client.send(url, b"{}")
                seen.append((await client.read(response)).decode())
                response.release()
        finally:
            await client.close()
        return seen

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(peer_port, log_level="warning", timeout_keep_alive=5)
    server = ThreadedServer(config, sock, what="the keep-alive server").start()
    try:
        first, soon_after, after_idling = asyncio.run(ports(f"http://127.0.0.1:{sock.getsockname()[1]}/"))
    finally:
        server.stop()
    assert KEEPALIVE_S < 5
    assert soon_after == first  # a connection in use is kept
    assert after_idling != first  # one idle past KEEPALIVE_S is not reused
