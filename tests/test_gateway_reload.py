"""Weight reloads through the gateway on a real vLLM server, while `openai` clients keep calling."""

import asyncio
import json
import time
from pathlib import Path

import httpx
import openai
import pytest
from fake_vllm import FakeVLLM
from gateway_server import (
    ADMIN_TOKEN,
    GatewayServer,
    assert_served_by_versions,
    reload_during_traffic,
    set_policy,
    set_policy_now,
    teacher_forced,
)
from transformers import AutoModelForCausalLM

from otel_rl.tinymodel import init_model

PROMPTS = ["What is 37 + 48?", "What is 12 * 3?", "What is 90 - 7?", "Add 1 and 2."]
MAX_TOKENS = 12
TRAFFIC = {"rollout_prefix": "reload-traffic", "max_tokens": MAX_TOKENS}  # keep_calling's calls
LOGPROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def new_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("checkpoint") / "seed1", seed=1)


def test_reload_in_the_middle_of_traffic_switches_every_call_cleanly(
    vllm_server, tiny_model_dir, new_checkpoint, tmp_path
):
    with GatewayServer(tmp_path / "store.duckdb", vllm=[vllm_server.url]) as gateway:
        try:
            responses, reloaded = reload_during_traffic(
                gateway, PROMPTS, TRAFFIC, 1, checkpoint=new_checkpoint
            )  # no call raised: none failed, retries included
            assert reloaded.status_code == 200, reloaded.text
            result = reloaded.json()
            assert (result["version"], result["previous_version"]) == (1, 0)
            assert [s["ok"] for s in result["servers"]] == [True]
            after = openai.OpenAI(base_url=gateway.url, api_key=ADMIN_TOKEN).chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": PROMPTS[0]}], temperature=0,
                max_tokens=MAX_TOKENS, extra_body={"return_token_ids": True},
            )  # fmt: skip
        finally:
            restored = set_policy(gateway, 2, checkpoint=tiny_model_dir)  # the session server's base weights
        assert restored.status_code == 200, restored.text
        assert restored.json()["servers"][0]["weights_changed"] is True

        models = {0: tiny_model_dir, 1: new_checkpoint}
        models = {v: AutoModelForCausalLM.from_pretrained(path).eval() for v, path in models.items()}
        where = "attributes->>'otel_rl.rollout.id' LIKE 'reload-traffic-%'"
        traffic = gateway.spans(where, expect=len(responses))
        spans = {s["attributes"]["gen_ai.response.id"]: s for s in traffic}
        versions = [spans[r.id]["attributes"]["otel_rl.policy.version"] for r in responses]
        assert {0, 1} <= set(versions), f"traffic did not straddle the reload: versions {set(versions)}"
        # The whole response comes from the weights of the version its span names: greedy tokens and
        # logprobs equal transformers' float32 forward pass of those weights.
        assert_served_by_versions(responses, versions, spans, models, LOGPROB_TOLERANCE)

        after_ids = after.choices[0].token_ids
        greedy = teacher_forced(models[1], after.prompt_token_ids, after_ids).argmax(-1).tolist()
        assert after_ids == greedy  # greedy output after the reload is transformers' for the new weights

        [reload_span] = gateway.query(
            "SELECT attributes FROM spans"
            " WHERE name = 'otel_rl.reload' AND attributes->>'otel_rl.policy.version' = '1'"
        ).to_pylist()
        timings = json.loads(reload_span["attributes"])
        assert timings["otel_rl.reload.total_ms"] >= timings["otel_rl.reload.reload_ms"] > 0
        metrics = httpx.get(f"{gateway.base_url}/metrics", headers=gateway.admin, timeout=10).text
        assert 'otel_rl_gateway_reloads_total{outcome="ok"} 2.0' in metrics
        assert 'otel_rl_gateway_last_reload_phase_seconds{phase="total"}' in metrics


def test_server_failing_a_reload_is_taken_out_and_reported(
    vllm_server, tiny_model_dir, new_checkpoint, tmp_path
):
    with (
        FakeVLLM() as broken,
        GatewayServer(tmp_path / "store.duckdb", vllm=[vllm_server.url, broken.base_url]) as gateway,
    ):
        try:
            reloaded = set_policy(gateway, 1, checkpoint=new_checkpoint)  # the fake has no /pause: it fails
            assert reloaded.status_code == 200, reloaded.text
            [failed] = [s for s in reloaded.json()["servers"] if not s["ok"]]
            assert failed["url"] == broken.base_url and "/pause" in failed["error"]

            policy_url = f"{gateway.base_url}/v1/admin/policy"
            policy = httpx.get(policy_url, headers=gateway.admin, timeout=10).json()
            assert policy["version"] == 1
            [out] = [s for s in policy["servers"] if not s["available"]]
            assert out["url"] == broken.base_url and "version 1" in out["out_reason"]
            client = openai.OpenAI(base_url=gateway.url, api_key=ADMIN_TOKEN)
            for n in range(6):  # rollouts that hashing would spread over both servers all go to the live one
                client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=1,
                    extra_headers={"x-otel-rl-rollout-id": f"taken-out-{n}"},
                )  # fmt: skip
            spans = gateway.spans("attributes->>'otel_rl.rollout.id' LIKE 'taken-out-%'", expect=6)
            assert {s["attributes"]["otel_rl.server.url"] for s in spans} == {vllm_server.url}
            assert {s["attributes"]["otel_rl.policy.version"] for s in spans} == {1}
        finally:
            assert set_policy(gateway, 2, checkpoint=tiny_model_dir).status_code == 200


def test_calls_outliving_the_drain_deadline_are_aborted_and_their_retries_succeed(
    vllm_server, tiny_model_dir, new_checkpoint, tmp_path
):
    with GatewayServer(tmp_path / "store.duckdb", vllm=[vllm_server.url], drain_timeout_s=0.05) as gateway:

        async def long_call(rollout_id: str, n: int):
            client = openai.AsyncOpenAI(base_url=gateway.url, api_key=ADMIN_TOKEN, max_retries=3)
            async with client:
                return await client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": PROMPTS[n % len(PROMPTS)]}],
                    # 6 calls x 16 choices x 480 tokens: several seconds of decoding even on a fast machine
                    temperature=1, max_tokens=480, n=16, extra_body={"ignore_eos": True},
                    extra_headers={"x-otel-rl-rollout-id": rollout_id},
                )  # fmt: skip

        async def scenario(prefix: str, version: int) -> tuple[list, httpx.Response]:
            # Long generations batched together keep the server busy well past the reload's start.
            calls = asyncio.gather(*(long_call(f"{prefix}-{n}", n) for n in range(6)))
            deadline = time.monotonic() + 60
            while gateway.gateway.coordinator.in_flight < 3:  # most are generating
                assert time.monotonic() < deadline, "the long calls never got going"
                await asyncio.sleep(0.005)
            reloaded = await set_policy_now(gateway, version, checkpoint=new_checkpoint)
            return await calls, reloaded

        # On a fast machine the calls can finish before the pause: that attempt proves nothing, so try again.
        for attempt in range(3):
            prefix, version = f"long{attempt}", 2 * attempt + 1
            try:
                responses, reloaded = asyncio.run(scenario(prefix, version))
            finally:
                assert set_policy(gateway, version + 1, checkpoint=tiny_model_dir).status_code == 200
            report = reloaded.json()
            if report["aborted"] >= 1:
                break
        assert report["aborted"] >= 1, f"no call was in flight past the drain deadline: {report}"
        assert report["in_flight_at_pause"] >= report["aborted"]
        assert all(len(r.choices[0].message.content or "") > 0 for r in responses)  # the retries succeeded
        spans = gateway.spans(
            f"attributes->>'otel_rl.rollout.id' LIKE '{prefix}-%'", expect=6 + report["aborted"]
        )
        # vLLM answers a call cut during its prefill with an error status instead of finish_reason "abort":
        # either way the gateway records a failed span of the old version.
        aborted = [s for s in spans if s["status_code"] == 2]
        assert len(aborted) == report["aborted"]
        assert {s["attributes"]["otel_rl.policy.version"] for s in aborted} == {version - 1}
        served = [s for s in spans if s["status_code"] != 2]
        assert {s["attributes"]["otel_rl.policy.version"] for s in served} == {version}
        assert {s["attributes"]["otel_rl.rollout.id"] for s in served} == {f"{prefix}-{n}" for n in range(6)}
