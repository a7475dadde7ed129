"""Serving with verl: replicas registered at runtime, and weight updates that verl's checkpoint engine makes
between the gateway's pause and its commit or abort. Fake vLLM servers in dev mode stand in for verl's
replicas (verl's vLLM needs a GPU); a stand-in with the method names of verl's CheckpointEngineManager moves
their weights, as the real one would, between the pause and the commit."""

import asyncio
import json
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from fake_vllm import MODEL, FakeVLLM, Fault
from gateway_server import ADMIN_TOKEN, GatewayServer, assert_served_by
from transformers import AutoModelForCausalLM

from otel_rl.tinymodel import init_model
from otel_rl.train.verl.serving import GatewayServing, ServingError

NEW_WEIGHTS = {"model.embed_tokens.weight": "a" * 64, "lm_head.weight": "b" * 64}
OTHER_WEIGHTS = {"model.embed_tokens.weight": "c" * 64, "lm_head.weight": "d" * 64}
LOGPROB_TOLERANCE = 1e-4  # as in test_gateway_reload.py


@dataclass
class Replica:
    """verl's RolloutReplica as serving.py reads it: the `HOST:PORT` of its vLLM server."""

    server_address: str


class StandInCheckpointEngine:
    """verl's CheckpointEngineManager as serving.py calls it: `update_weights(global_steps)` moves the weights
    of the replicas (here: the fakes' checksums) and notes what the gateway was doing meanwhile."""

    def __init__(self, gateway: GatewayServer, moves: list[tuple[FakeVLLM, dict[str, str]]]) -> None:
        self.gateway = gateway
        self.moves = moves
        self.seen: list[tuple[bool, int]] = []  # (the gateway holds its gate, calls in flight) at each update
        self.fail: Exception | None = None

    def update_weights(self, global_steps: int | None = None) -> dict:
        coordinator = self.gateway.gateway.coordinator
        self.seen.append((coordinator.busy, coordinator.in_flight))
        for fake, weights in self.moves:
            fake.weights = dict(weights)
        if self.fail is not None:
            raise self.fail
        return {}


@pytest.fixture
def fakes() -> Iterator[list[FakeVLLM]]:
    with ExitStack() as stack:
        yield [stack.enter_context(FakeVLLM(dev_mode=True)) for _ in range(4)]


@pytest.fixture
def gateway(tmp_path) -> Iterator[GatewayServer]:
    with GatewayServer(tmp_path / "store.duckdb", vllm=[]) as server:  # verl's replicas start later
        yield server


def serving(gateway: GatewayServer) -> GatewayServing:
    return GatewayServing(gateway.base_url, ADMIN_TOKEN)


def replica(fake: FakeVLLM) -> Replica:
    return Replica(f"127.0.0.1:{fake.port}")


def admin(gateway: GatewayServer, method: str, path: str, **kwargs) -> httpx.Response:
    return httpx.request(method, gateway.base_url + path, headers=gateway.admin, timeout=30, **kwargs)


def policy(gateway: GatewayServer) -> dict:
    return admin(gateway, "GET", "/v1/admin/policy").json()


def chat(gateway: GatewayServer, rollout: str) -> str:
    client = openai.OpenAI(base_url=gateway.url, api_key=ADMIN_TOKEN, max_retries=0)
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=20,
        extra_headers={"x-otel-rl-rollout-id": rollout},
    )
    return response.choices[0].message.content


def versions_and_servers(gateway: GatewayServer, prefix: str, n: int) -> tuple[set[int], set[str]]:
    spans = gateway.spans(f"attributes->>'otel_rl.rollout.id' LIKE '{prefix}-%'", expect=n)
    assert len(spans) == n and all(span["status_code"] != 2 for span in spans)
    attributes = [span["attributes"] for span in spans]
    return {a["otel_rl.policy.version"] for a in attributes}, {a["otel_rl.server.url"] for a in attributes}


def reload_span(gateway: GatewayServer, outcome: str) -> dict:
    sql = (
        "SELECT attributes, status_code FROM spans WHERE name = 'otel_rl.reload'"
        f" AND attributes->>'otel_rl.reload.external' = '{outcome}'"
    )
    deadline = time.monotonic() + 10
    while not (rows := gateway.query(sql).to_pylist()) and time.monotonic() < deadline:
        time.sleep(0.05)  # spans are stored in batches
    [row] = rows
    return json.loads(row["attributes"]) | {"status_code": row["status_code"]}


def test_verl_replicas_register_at_runtime_and_only_with_the_policys_weights(gateway, fakes):
    a, b, other, plain = fakes
    assert serving(gateway).register([replica(a), replica(b)]) == [a.base_url, b.base_url]
    assert {s["url"] for s in policy(gateway)["servers"] if s["available"]} == {a.base_url, b.base_url}
    assert {chat(gateway, f"registered-{n}") for n in range(4)} == {"Fake reply 0."}
    _, servers = versions_and_servers(gateway, "registered", 4)
    assert servers <= {a.base_url, b.base_url}

    other.weights = OTHER_WEIGHTS
    refused = admin(gateway, "POST", "/v1/admin/servers", json={"url": other.url})
    assert refused.status_code == 409 and "other weights than the policy's (version 0)" in refused.text
    no_dev_mode = FakeVLLM().start()
    try:
        unreachable = admin(gateway, "POST", "/v1/admin/servers", json={"url": no_dev_mode.base_url})
    finally:
        no_dev_mode.stop()
    assert unreachable.status_code == 502 and "VLLM_SERVER_DEV_MODE=1" in unreachable.text
    bad = admin(gateway, "POST", "/v1/admin/servers", json={"url": f"{plain.base_url}/v2"})
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("url ")
    too_long = admin(gateway, "POST", "/v1/admin/servers", json={"url": "http://h/" + "x" * 3000})
    assert too_long.status_code == 422

    assert (
        admin(gateway, "DELETE", "/v1/admin/servers", params={"url": f"{a.base_url}/v1"}).status_code == 200
    )
    assert {chat(gateway, f"after-deregister-{n}") for n in range(4)} == {"Fake reply 0."}
    _, servers = versions_and_servers(gateway, "after-deregister", 4)
    assert servers == {b.base_url}
    missing = admin(gateway, "DELETE", "/v1/admin/servers", params={"url": a.base_url})
    assert missing.status_code == 404 and a.base_url in missing.text


def test_every_new_admin_route_needs_the_admin_token(gateway, fakes):
    rollout_key = gateway.rollout_key("not-an-admin")
    routes = [
        ("POST", "/v1/admin/servers", {"json": {"url": fakes[0].base_url}}),
        ("DELETE", "/v1/admin/servers", {"params": {"url": fakes[0].base_url}}),
        ("POST", "/v1/admin/policy/pause", {"json": {}}),
        ("POST", "/v1/admin/policy/commit", {"json": {"lease": "x"}}),
        ("POST", "/v1/admin/policy/abort", {"json": {"lease": "x"}}),
    ]
    for method, path, body in routes:
        url = gateway.base_url + path
        assert httpx.request(method, url, timeout=10, **body).status_code == 401, path
        key = {"authorization": f"Bearer {rollout_key}"}
        assert httpx.request(method, url, headers=key, timeout=10, **body).status_code == 403, path
    assert policy(gateway)["servers"] == []


def test_streams_in_flight_at_the_pause_finish_on_the_old_version_and_later_calls_carry_the_next(
    gateway, fakes
):
    a, b = fakes[:2]
    client = serving(gateway)
    client.register([replica(a), replica(b)])
    for fake in (a, b):  # every stream takes ~2 s: they are all generating when the update pauses
        fake.inject(*[Fault(chunk_delay_s=0.3) for _ in range(4)])
    engine = StandInCheckpointEngine(gateway, [(a, NEW_WEIGHTS), (b, NEW_WEIGHTS)])

    async def scenario() -> tuple[list[str], dict, str]:
        async def stream(rollout: str) -> str:
            async with openai.AsyncOpenAI(base_url=gateway.url, api_key=ADMIN_TOKEN, max_retries=0) as api:
                chunks = await api.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "Hi"}],
                    stream=True,
                    extra_headers={"x-otel-rl-rollout-id": rollout},
                )
                return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])

        streams = asyncio.gather(*(stream(f"in-flight-{n}") for n in range(4)))
        deadline = time.monotonic() + 10
        while gateway.gateway.coordinator.in_flight < 4:
            assert time.monotonic() < deadline, "the streams never got going"
            await asyncio.sleep(0.005)
        update = asyncio.create_task(asyncio.to_thread(client.update_weights, engine, global_steps=1))
        while not gateway.gateway.coordinator.busy:
            await asyncio.sleep(0.005)
        held = asyncio.create_task(stream("held-at-the-gate"))  # waits for the commit
        report = await update
        return await streams, report, await held

    texts, report, held = asyncio.run(scenario())
    assert texts == ["Fake reply 0."] * 4 and held == "Fake reply 0."  # none failed, none was cut
    assert engine.seen == [(True, 0)]  # verl moved the weights with the gate closed and every call drained
    assert report["outcome"] == "committed" and (report["version"], report["previous_version"]) == (1, 0)
    assert report["in_flight_at_pause"] == 4 and report["aborted"] == 0
    assert all(server["ok"] and server["weights_changed"] for server in report["servers"])
    assert {r.path for r in a.requests} >= {"/weight_checker", "/reset_prefix_cache", "/resume"}

    versions, _ = versions_and_servers(gateway, "in-flight", 4)
    assert versions == {0}
    for n in range(4):
        chat(gateway, f"after-commit-{n}")
    versions, _ = versions_and_servers(gateway, "after-commit", 4)
    assert versions == {1} == versions_and_servers(gateway, "held", 1)[0]
    span = reload_span(gateway, "committed")
    assert span["otel_rl.policy.version"] == 1 and span["otel_rl.reload.in_flight_at_pause"] == 4
    assert span["otel_rl.reload.total_ms"] >= span["otel_rl.reload.reload_ms"] > 0
    assert span["otel_rl.reload.drain_ms"] > 0 and span["otel_rl.reload.verify_ms"] > 0
    metrics = admin(gateway, "GET", "/metrics").text
    assert re.search(r'^otel_rl_gateway_reloads_total\{outcome="ok"\} 1(\.0)?$', metrics, re.MULTILINE), (
        metrics
    )


def test_a_weight_mismatch_fails_the_servers_that_differ_and_they_stay_out(gateway, fakes):
    a, b, c, d = fakes
    client = serving(gateway)
    client.register([replica(f) for f in fakes])
    # a and b get the new weights, c other ones, d none: c and d must not serve version 1
    engine = StandInCheckpointEngine(gateway, [(a, NEW_WEIGHTS), (b, NEW_WEIGHTS), (c, OTHER_WEIGHTS)])
    report = client.update_weights(engine, global_steps=1)
    assert report["version"] == 1
    errors = {server["url"]: server["error"] for server in report["servers"]}
    assert errors[a.base_url] is None and errors[b.base_url] is None
    assert "differ from the other servers'" in errors[c.base_url]
    assert "did not change while the others' did" in errors[d.base_url]
    out = {s["url"]: s["out_reason"] for s in policy(gateway)["servers"] if not s["available"]}
    assert set(out) == {c.base_url, d.base_url} and all("version 1" in reason for reason in out.values())
    for n in range(6):
        chat(gateway, f"after-mismatch-{n}")
    versions, servers = versions_and_servers(gateway, "after-mismatch", 6)
    assert versions == {1} and servers <= {a.base_url, b.base_url}
    assert reload_span(gateway, "committed")["status_code"] == 2  # the span names the failures


def test_a_failed_update_aborts_and_the_servers_whose_weights_did_not_move_resume_on_the_old_version(
    gateway, fakes
):
    a, b = fakes[:2]
    client = serving(gateway)
    client.register([replica(a), replica(b)])
    # a commit of weights that moved nowhere changes nothing: the version stays, the servers stay in
    unchanged = admin(gateway, "POST", "/v1/admin/policy/pause", json={"lease_s": 30})
    commit = admin(gateway, "POST", "/v1/admin/policy/commit", json={"lease": unchanged.json()["lease"]})
    assert commit.status_code == 409 and commit.json()["outcome"] == "unchanged"
    assert "stays at version 0" in commit.json()["error"]["message"]
    assert all(server["available"] for server in policy(gateway)["servers"])

    engine = StandInCheckpointEngine(gateway, [(a, NEW_WEIGHTS)])  # verl fails after moving a's weights
    engine.fail = RuntimeError("NCCL timeout")
    with pytest.raises(RuntimeError, match="NCCL timeout"):
        client.update_weights(engine, global_steps=1)
    state = policy(gateway)
    assert state["version"] == 0 and state["last_reload"]["version"] == 0
    [out] = [s for s in state["servers"] if not s["available"]]
    assert out["url"] == a.base_url and "aborted update" in out["out_reason"]
    for n in range(4):
        chat(gateway, f"after-abort-{n}")
    versions, servers = versions_and_servers(gateway, "after-abort", 4)
    assert versions == {0} and servers == {b.base_url}
    assert reload_span(gateway, "aborted")["otel_rl.policy.version"] == 0


def test_one_lease_at_a_time_checked_input_and_an_expired_lease_takes_the_servers_out(gateway, fakes):
    a = fakes[0]
    serving(gateway).register([replica(a)])
    for bad in ({"lease_s": 0}, {"lease_s": 1e9}, {"lease_s": "soon"}, {"version": 0}):
        answer = admin(gateway, "POST", "/v1/admin/policy/pause", json=bad)
        assert answer.status_code in (400, 422), (bad, answer.text)
    lease = admin(gateway, "POST", "/v1/admin/policy/pause", json={"version": 7, "lease_s": 3}).json()
    assert lease["version"] == 7 and lease["servers"] == [a.base_url]
    busy = [
        admin(gateway, "POST", "/v1/admin/policy/pause", json={}),
        admin(
            gateway,
            "POST",
            "/v1/admin/policy",
            json={"version": 8, "checkpoint": str(gateway.store.path.parent)},
        ),
        admin(gateway, "POST", "/v1/admin/servers", json={"url": fakes[1].base_url}),
        admin(gateway, "DELETE", "/v1/admin/servers", params={"url": a.base_url}),
    ]
    assert [answer.status_code for answer in busy] == [409] * 4, [answer.text for answer in busy]
    wrong = admin(gateway, "POST", "/v1/admin/policy/commit", json={"lease": uuid.uuid4().hex})
    assert wrong.status_code == 409 and "no open lease" in wrong.text
    assert admin(gateway, "POST", "/v1/admin/policy/commit", json={"lease": "x" * 65}).status_code == 422
    assert admin(gateway, "POST", "/v1/admin/policy/abort", json={"lease": "é☃"}).status_code == 409

    deadline = time.monotonic() + 20  # the lease expires: the gate opens, the server is out (its weights
    while gateway.gateway.coordinator.busy:  # may still be moving)
        assert time.monotonic() < deadline, "the lease never expired"
        time.sleep(0.05)
    late = admin(gateway, "POST", "/v1/admin/policy/commit", json={"lease": lease["lease"]})
    assert late.status_code == 409 and "expired or ended" in late.text
    state = policy(gateway)
    assert state["version"] == 0 and "lease" in state["servers"][0]["out_reason"]
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as refused:
        chat(gateway, "after-expiry")
    assert refused.value.status_code == 503 and time.monotonic() - started < 5  # not held at a closed gate
    assert reload_span(gateway, "expired")["status_code"] == 2

    back = admin(gateway, "POST", "/v1/admin/servers", json={"url": a.base_url})  # its weights did not move
    assert back.status_code == 200 and back.json()["available"] is True
    assert chat(gateway, "after-reregister") == "Fake reply 0."


def test_an_update_with_no_server_registered_is_refused_before_verl_moves_anything(gateway):
    engine = StandInCheckpointEngine(gateway, [])
    with pytest.raises(ServingError, match="HTTP 409: no inference server to update"):
        serving(gateway).update_weights(engine, global_steps=1)
    assert engine.seen == []
    assert policy(gateway)["version"] == 0
    assert not gateway.gateway.coordinator.busy  # the refused pause left the gate open


class ReloadingCheckpointEngine:
    """Moves a real vLLM server's weights as verl's checkpoint engine would, from outside the gateway (here
    with vLLM's own `reload_weights`, since verl's NCCL transfer needs a GPU)."""

    def __init__(self, url: str, checkpoint: Path) -> None:
        self.url, self.checkpoint = url, checkpoint

    def update_weights(self, global_steps: int | None = None) -> dict:
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(self.checkpoint)}}
        httpx.post(f"{self.url}/collective_rpc", json=body, timeout=300).raise_for_status()
        return {}


def test_on_a_real_vllm_server_the_commit_verifies_the_weights_moved_outside_the_gateway(
    vllm_server, tiny_model_dir, tmp_path
):
    new_checkpoint = init_model(tmp_path / "seed2", seed=2)
    with GatewayServer(tmp_path / "store.duckdb", vllm=[]) as gateway:
        client = serving(gateway)
        client.register([Replica(vllm_server.url.removeprefix("http://"))])
        try:
            report = client.update_weights(
                ReloadingCheckpointEngine(vllm_server.url, new_checkpoint), global_steps=1
            )
            assert report["version"] == 1 and report["servers"][0]["weights_changed"] is True
            api = openai.OpenAI(base_url=gateway.url, api_key=ADMIN_TOKEN, max_retries=0)
            after = api.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "What is 2 + 2?"}], temperature=0,
                max_tokens=8, logprobs=True, extra_body={"return_token_ids": True},
                extra_headers={"x-otel-rl-rollout-id": "real-after-commit"},
            )  # fmt: skip
        finally:  # the session's server goes back to its base weights, under the gateway's protocol too
            restored = client.update_weights(
                ReloadingCheckpointEngine(vllm_server.url, tiny_model_dir), global_steps=2
            )
        assert restored["version"] == 2 and restored["servers"][0]["ok"]
        [span] = gateway.spans("attributes->>'otel_rl.rollout.id' = 'real-after-commit'")
        assert span["attributes"]["otel_rl.policy.version"] == 1
        model = AutoModelForCausalLM.from_pretrained(new_checkpoint).eval()
        assert_served_by(model, after, LOGPROB_TOLERANCE)  # the call came from the weights verl moved
