"""A tiny model built with a long context, served at the length its config declares by `serve --model`."""

import json
import subprocess
from pathlib import Path

import httpx
import pytest
from otel_rl_server import OTEL_RL, ServerProcess
from typer.testing import CliRunner

from otel_rl.cli import app
from otel_rl.gateway.vllm import VLLMServer
from otel_rl.gateway.vllm_env import vllm_python

ROOT = Path(__file__).resolve().parent.parent
LONG = 65536
# A coding CLI's first prompt is 30-55K characters of instructions and tool schemas: prose and markdown much
# like the project's own documentation, which stands in for it here.
PROMPT_CHARS = 40_000


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("long_model") / "tiny"
    built = subprocess.run(
        [str(OTEL_RL), "model", "init", str(folder), "--max-positions", str(LONG)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    return folder


def long_prompt() -> str:
    text = "\n\n".join(page.read_text() for page in sorted((ROOT / "docs").glob("*.md")))
    assert len(text) >= PROMPT_CHARS
    return text[:PROMPT_CHARS]


def test_model_init_declares_the_positions_it_was_given(long_model):
    config = json.loads((long_model / "config.json").read_text())
    tokenizer = json.loads((long_model / "tokenizer_config.json").read_text())
    assert config["max_position_embeddings"] == LONG and tokenizer["model_max_length"] == LONG
    refused = CliRunner().invoke(app, ["model", "init", str(long_model.parent / "x"), "--max-positions", "8"])
    assert refused.exit_code == 2 and "--max-positions" in refused.output


def test_vllm_serves_the_declared_context_unless_told_less(long_model, tiny_model_dir):
    python = Path("python")
    assert VLLMServer(long_model).max_model_len == LONG
    assert VLLMServer(tiny_model_dir).max_model_len == 1024  # the default shape's positions
    command = VLLMServer(long_model, max_model_len=4096)._command(python)
    assert command[command.index("--max-model-len") + 1] == "4096"
    with pytest.raises(ValueError, match=f"over the {LONG} positions"):
        VLLMServer(long_model, max_model_len=LONG + 1)
    with pytest.raises(ValueError, match="positive"):
        VLLMServer(long_model, max_model_len=0)


def test_serve_refuses_a_context_without_a_model_or_over_the_declared(long_model, tmp_path):
    alone = CliRunner().invoke(app, ["serve", "--db", str(tmp_path / "a.duckdb"), "--max-model-len", "4096"])
    assert alone.exit_code == 2 and "needs --model" in alone.output
    flags = ["--model", str(long_model), "--max-model-len", str(LONG * 2)]
    over = CliRunner().invoke(app, ["serve", "--db", str(tmp_path / "b.duckdb"), *flags])
    assert over.exit_code == 2 and f"over the {LONG} positions" in over.output


def test_serve_model_answers_a_cli_sized_prompt_through_the_gateway(long_model, tiny_tokenizer, tmp_path):
    vllm_python()  # the vLLM environment must be built (make vllm-env)
    prompt = long_prompt()
    prompt_tokens = len(tiny_tokenizer(prompt)["input_ids"])
    assert 4 * 1024 < prompt_tokens < LONG  # far past the default shape's 1024, inside the declared length
    server = ServerProcess(tmp_path / "store.duckdb", tmp_path, flags=("--model", str(long_model)))
    server.start(timeout=600)
    try:
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 4,
            "return_token_ids": True,
        }
        response = httpx.post(
            f"{server.http_url}/v1/chat/completions", json=body, headers=server.auth, timeout=600
        )
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["usage"]["prompt_tokens"] > prompt_tokens  # the chat template's tokens around it
        assert len(answer["prompt_token_ids"]) == answer["usage"]["prompt_tokens"]
    finally:
        server.stop(timeout=120)
