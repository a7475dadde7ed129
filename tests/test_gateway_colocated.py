"""Colocated mode (`serve --colocated`): the servers sleep while the trainer updates and wake with its
weights. Fake vLLM servers speak vLLM's sleep endpoints (`POST /sleep?level=1`, `POST /wake_up`,
`GET /is_sleeping`) and refuse any generation while asleep: vLLM's CPU build ignores sleep (its worker
logs "sleep mode is not supported on CPU") and refuses `--enable-sleep-mode`, so it cannot show this."""

import concurrent.futures
import json
import re
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import pytest
from fake_vllm import MODEL, FakeVLLM
from gateway_server import ADMIN_TOKEN, GatewayServer


@pytest.fixture
def fakes() -> Iterator[list[FakeVLLM]]:
    with ExitStack() as stack:
        yield [stack.enter_context(FakeVLLM(dev_mode=True)) for _ in range(2)]


@pytest.fixture
def gateway(fakes, tmp_path) -> Iterator[GatewayServer]:
    urls = [fake.url for fake in fakes]
    with GatewayServer(tmp_path / "store.duckdb", vllm=urls, colocated=True) as server:
        yield server


def admin(gateway: GatewayServer, path: str, **kwargs) -> httpx.Response:
    return httpx.post(gateway.base_url + path, headers=gateway.admin, timeout=60, **kwargs)


def call(gateway: GatewayServer, text: str) -> str:
    client = openai.OpenAI(base_url=gateway.url, api_key=ADMIN_TOKEN, max_retries=0)
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}])
    return reply.choices[0].message.content


def checkpoint(folder: Path) -> Path:
    """A model folder as the fake's reload_weights reads it: its safetensors' digests are the weights."""
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"the trainer's new weights")
    return folder


def test_calls_during_an_update_wait_and_no_call_reaches_a_sleeping_server(gateway, fakes, tmp_path):
    assert call(gateway, "before").startswith("Fake reply")
    asleep = admin(gateway, "/v1/admin/policy/sleep")
    assert asleep.status_code == 200, asleep.text
    assert asleep.json()["sleep_ms"] > 0
    for fake in fakes:
        assert httpx.get(fake.base_url + "/is_sleeping").json() == {"is_sleeping": True}
        assert fake.sleep_level == 1
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        waiting = [pool.submit(call, gateway, f"during {i}") for i in range(4)]
        # The gate holds them until the wake: none has an answer (nor an error) while the servers sleep.
        done, _ = concurrent.futures.wait(waiting, timeout=1.0)
        assert not done
        woken = admin(
            gateway,
            "/v1/admin/policy/wake",
            json={"version": 1, "checkpoint": str(checkpoint(tmp_path / "step-1"))},
        )
        assert woken.status_code == 200, woken.text
        replies = [future.result(timeout=30) for future in waiting]
    assert all(reply.startswith("Fake reply") for reply in replies)
    result = woken.json()
    assert (result["version"], result["previous_version"]) == (1, 0)
    assert [server["ok"] for server in result["servers"]] == [True, True]
    assert result["colocated_pause_ms"] == result["total_ms"] >= 1000  # the calls waited ≥ 1 s at the gate
    assert result["wake_ms"] > 0 and result["sleep_ms"] > 0
    for fake in fakes:
        assert fake.calls_while_asleep == 0
        assert httpx.get(fake.base_url + "/is_sleeping").json() == {"is_sleeping": False}
        steps = [r.path for r in fake.requests if not r.path.startswith("/v1/")]
        # asleep, woken, then the ordinary reload: the new weights are loaded once awake
        assert steps[steps.index("/sleep") :][:3] == ["/sleep", "/wake_up", "/pause"]
        assert "/collective_rpc" in steps[steps.index("/wake_up") :]
        assert [r.body for r in fake.requests if r.path == "/sleep"] == [{"level": "1"}]
    policy = httpx.get(gateway.base_url + "/v1/admin/policy", headers=gateway.admin).json()
    assert policy["colocated"] is True and policy["version"] == 1
    metrics = httpx.get(f"{gateway.base_url}/metrics", headers=gateway.admin, timeout=10).text
    count = re.search(r"^otel_rl_gateway_colocated_pause_seconds_count (\S+)$", metrics, re.M)
    assert count is not None and float(count.group(1)) == 1.0
    [span] = gateway.query(
        "SELECT attributes FROM spans"
        " WHERE name = 'otel_rl.reload' AND attributes->>'otel_rl.policy.version' = '1'"
    ).to_pylist()
    attributes = json.loads(span["attributes"])
    assert attributes["otel_rl.reload.colocated"] == "woken"
    assert attributes["otel_rl.reload.total_ms"] == result["total_ms"]


def test_a_sleep_not_woken_in_time_wakes_on_the_old_weights(gateway, fakes):
    old = dict(fakes[0].weights)
    assert admin(gateway, "/v1/admin/policy/sleep", json={"lease_s": 0.5}).status_code == 200
    assert call(gateway, "after the lease").startswith("Fake reply")  # waited out the lease, then served
    assert all(fake.sleep_level == 0 and fake.calls_while_asleep == 0 for fake in fakes)
    assert fakes[0].weights == old
    late = admin(gateway, "/v1/admin/policy/wake", json={"version": 1, "checkpoint": str(Path.cwd())})
    assert late.status_code == 409 and "no colocated update is open" in late.text
    assert httpx.get(gateway.base_url + "/v1/admin/policy", headers=gateway.admin).json()["version"] == 0


def test_sleep_is_refused_unless_the_gateway_is_colocated(fakes, tmp_path):
    with GatewayServer(tmp_path / "store.duckdb", vllm=[fakes[0].url]) as gateway:
        refused = admin(gateway, "/v1/admin/policy/sleep")
        assert refused.status_code == 409 and "serve --colocated" in refused.text
        assert fakes[0].sleep_level == 0


def test_the_fake_speaks_vllms_sleep_endpoints(fakes):
    fake = fakes[0]
    assert httpx.post(fake.base_url + "/sleep", params={"level": 3}).status_code == 422  # Query(ge=0, le=2)
    assert httpx.post(fake.base_url + "/sleep").json() == {"status": "sleeping", "level": 1}
    refused = httpx.post(fake.url + "/chat/completions", json={"model": MODEL, "messages": []})
    assert refused.status_code == 503 and fake.calls_while_asleep == 1
    woken = httpx.post(fake.base_url + "/wake_up", params=[("tags", "weights"), ("tags", "kv_cache")])
    assert woken.json() == {"status": "awake", "tags": ["weights", "kv_cache"]}
    assert httpx.get(fake.base_url + "/is_sleeping").json() == {"is_sleeping": False}
