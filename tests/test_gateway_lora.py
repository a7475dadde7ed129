"""The light reload path: the policy as a LoRA adapter loaded at run time on a real vLLM server.

The session's vLLM server runs with LoRA enabled (conftest.py, rank ≤ 8). Adapters are written here in PEFT's
format; the reference is transformers' float32 model with the adapter merged into the base weights.
"""

import asyncio
import json
from pathlib import Path

import httpx
import openai
import pytest
import torch
from gateway_server import (
    ADMIN_TOKEN,
    GatewayServer,
    assert_served_by_versions,
    reload_during_traffic,
    set_policy,
)
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from otel_rl.gateway.reload import LORA_NAME
from otel_rl.gateway.servers import ServerPool
from otel_rl.gateway.vllm import VLLMServer

PROMPTS = ["What is 37 + 48?", "What is 12 * 3?", "Add 1 and 2."]
MAX_TOKENS = 12
TRAFFIC = {"rollout_prefix": "lora-traffic", "max_tokens": MAX_TOKENS}  # keep_calling's calls
LOGPROB_TOLERANCE = 1e-4
LORA_ALPHA = 16
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_adapter(folder: Path, base: Path, *, seed: int, rank: int = 8) -> Path:
    """A random LoRA adapter (PEFT's files), large enough to change what the tiny model says."""
    model = AutoModelForCausalLM.from_pretrained(base)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in TARGETS:
            out_features, in_features = module.weight.shape
            a = torch.randn(rank, in_features, generator=generator) * 0.3
            tensors[f"base_model.model.{name}.lora_A.weight"] = a
            tensors[f"base_model.model.{name}.lora_B.weight"] = (
                torch.randn(out_features, rank, generator=generator) * 0.3
            )
    folder.mkdir(parents=True)
    save_file(tensors, folder / "adapter_model.safetensors")
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base),
        "r": rank, "lora_alpha": LORA_ALPHA, "target_modules": list(TARGETS), "lora_dropout": 0.0,
        "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
    }  # fmt: skip
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def merged_model(base: Path, adapter: Path):
    """transformers' float32 model with the adapter merged: W + alpha / r · B A."""
    from safetensors.torch import load_file

    model = AutoModelForCausalLM.from_pretrained(base).eval()
    tensors = load_file(adapter / "adapter_model.safetensors")
    rank = json.loads((adapter / "adapter_config.json").read_text())["r"]
    with torch.no_grad():
        for name, module in model.named_modules():
            a = tensors.get(f"base_model.model.{name}.lora_A.weight")
            if a is not None:
                module.weight += LORA_ALPHA / rank * tensors[f"base_model.model.{name}.lora_B.weight"] @ a
    return model


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("lora")
    return {
        "a": write_adapter(folder / "a", tiny_model_dir, seed=1),
        "b": write_adapter(folder / "b", tiny_model_dir, seed=2),
        "rank16": write_adapter(folder / "rank16", tiny_model_dir, seed=3, rank=16),
    }


def test_lora_adapter_reloads_serve_the_adapters_weights_and_every_span_names_its_version(
    vllm_server, tiny_model_dir, adapters, tmp_path
):
    with GatewayServer(tmp_path / "store.duckdb", vllm=[vllm_server.url]) as gateway:
        try:
            first = set_policy(gateway, 1, lora_adapter=adapters["a"])
            assert first.status_code == 200, first.text
            assert [s["ok"] for s in first.json()["servers"]] == [True]
            policy = httpx.get(f"{gateway.base_url}/v1/admin/policy", headers=gateway.admin, timeout=10)
            assert (policy.json()["version"], policy.json()["lora_adapter"]) == (1, str(adapters["a"]))
            responses, second = reload_during_traffic(
                gateway, PROMPTS, TRAFFIC, 2, lora_adapter=adapters["b"]
            )  # no call raised: none failed, retries included
            assert second.status_code == 200, second.text
            assert (second.json()["previous_version"], second.json()["lora_adapter"]) == (
                1,
                str(adapters["b"]),
            )
        finally:
            restored = set_policy(gateway, 3, checkpoint=tiny_model_dir)  # the session server's base weights
        assert restored.status_code == 200, restored.text
        # A checkpoint ends the adapter policy: vLLM no longer lists (or serves) the adapter.
        assert [m.id for m in openai.OpenAI(base_url=gateway.url, api_key=ADMIN_TOKEN).models.list()] == [
            "tiny"
        ]

        models = {v: merged_model(tiny_model_dir, adapters[name]) for v, name in ((1, "a"), (2, "b"))}
        spans = gateway.spans(
            "attributes->>'otel_rl.rollout.id' LIKE 'lora-traffic-%'", expect=len(responses)
        )
        spans = {s["attributes"]["gen_ai.response.id"]: s for s in spans}
        versions = [spans[r.id]["attributes"]["otel_rl.policy.version"] for r in responses]
        assert set(versions) == {1, 2}, f"traffic did not straddle the reload: versions {set(versions)}"
        for response in responses:
            attributes = spans[response.id]["attributes"]
            # The gateway sent the call to the adapter: the client asked for the base model's name.
            assert response.model == attributes["gen_ai.response.model"] == LORA_NAME
            assert attributes["gen_ai.request.model"] == "tiny"
        # Greedy tokens and logprobs are those of transformers' float32 model with that version's adapter.
        checked = assert_served_by_versions(responses, versions, spans, models, LOGPROB_TOLERANCE)
        # The two adapters answer differently: the check above could not pass with a stale adapter.
        assert (
            len({key[2] for key in checked if key[0] == 1} ^ {key[2] for key in checked if key[0] == 2}) > 0
        )

        [reload_span] = gateway.query(
            "SELECT attributes FROM spans"
            " WHERE name = 'otel_rl.reload' AND attributes->>'otel_rl.policy.version' = '2'"
        ).to_pylist()
        assert json.loads(reload_span["attributes"])["otel_rl.reload.lora_adapter"] == str(adapters["b"])


def test_an_adapter_no_server_can_load_leaves_the_serving_policy_in_place_until_a_reload_succeeds(
    vllm_server, tiny_model_dir, adapters, tmp_path
):
    with GatewayServer(tmp_path / "store.duckdb", vllm=[vllm_server.url]) as gateway:
        client = openai.OpenAI(base_url=gateway.url, api_key=ADMIN_TOKEN, max_retries=0)
        call = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        try:
            failed = set_policy(gateway, 1, lora_adapter=adapters["rank16"])  # the server allows rank ≤ 8
            assert failed.status_code == 502, failed.text
            [server] = failed.json()["servers"]
            assert not server["ok"] and "load_lora_adapter" in server["error"]
            # Failed on every server, whose weights still checksum as version 0's: version 0 keeps serving,
            # and calls are recorded as its own (docs/security.md#availability).
            policy = httpx.get(f"{gateway.base_url}/v1/admin/policy", headers=gateway.admin, timeout=10)
            assert policy.json()["version"] == 0 and policy.json()["lora_adapter"] is None
            assert client.chat.completions.create(**call).model == "tiny"
        finally:
            restored = set_policy(gateway, 2, checkpoint=tiny_model_dir)
        assert restored.status_code == 200, restored.text
        assert client.chat.completions.create(**call).model == "tiny"


def test_local_server_is_started_with_lora_enabled_only_when_asked(tiny_model_dir):
    python = Path("python")
    assert "--enable-lora" not in VLLMServer(tiny_model_dir)._command(python)
    command = VLLMServer(tiny_model_dir, lora_rank=16)._command(python)
    assert command[command.index("--enable-lora") :] == [
        "--enable-lora",
        "--max-lora-rank",
        "16",
        "--max-loras",
        "1",
    ]
    with pytest.raises(ValueError, match="lora_rank"):
        VLLMServer(tiny_model_dir, lora_rank=12)


class ComingBack:
    """A vLLM server's answers to the gateway's health probe, after a restart (base weights, no adapter)."""

    def __init__(self, adapter: str | None) -> None:
        self.adapter = adapter

    async def request(self, method: str, url: str, *, timeout_s: float, **kwargs) -> tuple[int, bytes]:
        if url.endswith("/weight_checker"):
            return 200, json.dumps({"checksums": {"w": "base"}}).encode()
        models = [{"id": "tiny", "root": "/base"}] + (
            [{"id": LORA_NAME, "root": self.adapter}] if self.adapter else []
        )
        return 200, json.dumps({"data": models}).encode() if url.endswith("/v1/models") else b""


@pytest.mark.parametrize(("adapter", "rejoins"), [(None, False), ("/lora/6", False), ("/lora/7", True)])
def test_server_coming_back_rejoins_only_if_it_serves_the_policys_adapter(adapter, rejoins):
    pool = ServerPool(("http://127.0.0.1:1",))
    [server] = pool.servers
    server.healthy = False  # it went down
    pool.reference_checksums, pool.reference_adapter = (
        {"w": "base"},
        "/lora/7",
    )  # the policy: base + adapter 7
    asyncio.run(pool.probe(ComingBack(adapter), timeout_s=1))
    assert server.available is rejoins
    assert (server.out_reason is None) is rejoins
