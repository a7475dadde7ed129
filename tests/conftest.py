"""Shared pytest fixtures: real components on loopback (each owner adds theirs)."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_vllm import FakeVLLM
from otel_rl_server import ServerProcess

from otel_rl.gateway.vllm import VLLMServer
from otel_rl.tinymodel import init_model


@pytest.fixture
def fake_vllm() -> Iterator[FakeVLLM]:
    """A vLLM-style fake OpenAI server on a free loopback port; script it with `.script()` / `.inject()`."""
    with FakeVLLM() as server:
        yield server


@pytest.fixture(scope="session")
def otel_rl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A real `otel-rl serve` subprocess for the session: free ports, a temp DB, a known admin token.

    Attributes: http_url, grpc_target, token, db; helpers .sql(q) -> Arrow table (via /v1/query), .counts().
    Tests share it: count only the rows with your own (unique) ids.
    """
    workdir = tmp_path_factory.mktemp("otel_rl_server")
    server = ServerProcess(workdir / "otel_rl.duckdb", workdir).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2 model (seed 0, docs/model.md), built once per session; read-only for tests."""
    return init_model(tmp_path_factory.mktemp("tiny_model") / "tiny")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path):
    """The tiny model's tokenizer (chat template with tools), loaded once per session."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """One real vLLM server on `tiny_model_dir` for the session (model name "tiny"; ≈30 s to start), with
    LoRA adapters up to rank 8 loadable at run time (test_gateway_lora.py), so that one server serves all.

    Tests that reload its weights must reload `tiny_model_dir`'s before they end: others expect those.
    """
    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with VLLMServer(tiny_model_dir, served_model_name="tiny", log_path=log_path, lora_rank=8) as server:
        yield server
