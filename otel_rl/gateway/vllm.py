"""A local vLLM OpenAI-compatible server: its command (docs/model.md), start, warm-up and stop."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Self

import httpx

from otel_rl.gateway.vllm_env import tail, vllm_python
from otel_rl.gateway.vllm_flags import Device, declared_dtype, server_flags
from otel_rl.gateway.vllm_machine import this_machine

MAX_CONFIG_BYTES = 1024 * 1024  # a model's config.json is a few KB
# The ranks vLLM accepts as the largest LoRA rank it reserves room for (`--max-lora-rank`).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
SERVER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_SERVER_DEV_MODE": "1",  # /pause, /collective_rpc reload_weights, /reset_prefix_cache, /resume
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
CPU_KV_CACHE_GIB = 1
# On CPU only: without it, vLLM's CPU build asks for most of the machine's memory for its KV cache.
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": str(CPU_KV_CACHE_GIB)}


class VLLMStartError(RuntimeError):
    """A vLLM server did not become healthy."""


def read_config(config_path: Path) -> dict:
    """A model folder's config.json, bounded in size."""
    if config_path.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"{config_path} is over {MAX_CONFIG_BYTES} bytes; is it a model's config?")
    try:
        config = json.loads(config_path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{config_path} is not a JSON object: {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} is not a JSON object")
    return config


def _context_length(config: dict, config_path: Path, asked: int | None) -> int:
    """The context to serve: `asked`, checked against what the model's config declares, or the declared."""
    declared = config.get("max_position_embeddings")
    if asked is not None and asked < 1:
        raise ValueError(f"max_model_len must be a positive number of tokens, not {asked}")
    if not isinstance(declared, int) or isinstance(declared, bool) or declared < 1:
        if asked is None:
            raise ValueError(f"{config_path} declares no max_position_embeddings; give max_model_len")
        return asked
    if asked is not None and asked > declared:
        raise ValueError(
            f"max_model_len {asked} is over the {declared} positions {config_path} declares; "
            "build the model with more (otel-rl model init --max-positions)"
        )
    return declared if asked is None else asked


def free_ports(n: int) -> list[int]:
    """`n` distinct free loopback ports. The sockets are bound together: ports taken one at a time can come
    back the same (the OS may hand out a port again once its socket is closed)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class VLLMServer:
    """One vLLM OpenAI-compatible server for a local model folder, bound to 127.0.0.1."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        port: int | None = None,
        served_model_name: str | None = None,
        log_path: str | Path | None = None,
        lora_rank: int | None = None,
        max_model_len: int | None = None,
        vllm_args: Sequence[str] = (),
        device: Device | None = None,
        placement: Mapping[str, str] | None = None,
    ) -> None:
        """`lora_rank`: serve LoRA adapters up to this rank, loaded at run time (the gateway's light reload
        path, docs/gateway.md); None: LoRA off. `max_model_len`: prompt plus completion, in tokens, at most
        what the model's config declares; None: the declared length (a coding CLI's first prompt needs
        ~34K tokens of the tiny model's vocabulary: `otel-rl model init --max-positions`). `vllm_args`: vLLM's
        own flags, after ours (one of ours that they name is left out: `--dtype bfloat16`,
        `--no-enforce-eager`).
        `device`: "cpu" or "cuda" (default: cuda where the machine has an NVIDIA GPU). `placement`: variables
        that put this server on its devices (vllm_machine.place_replicas)."""
        if lora_rank is not None and lora_rank not in LORA_RANKS:
            raise ValueError(
                f"lora_rank must be one of {LORA_RANKS} (vLLM's --max-lora-rank), not {lora_rank}"
            )
        self.model_dir = Path(model_dir).resolve()
        if not (self.model_dir / "config.json").is_file():
            raise FileNotFoundError(f"{self.model_dir} has no config.json; is it a model folder?")
        self.port = port or free_ports(1)[0]
        self.served_model_name = served_model_name or self.model_dir.name
        self.log_path = Path(log_path) if log_path else None
        self.lora_rank = lora_rank
        config = read_config(self.model_dir / "config.json")
        self.max_model_len = _context_length(config, self.model_dir / "config.json", max_model_len)
        self.dtype = declared_dtype(config)  # the model's own; None: vLLM's choice
        self.device: Device = device or ("cuda" if this_machine().gpus else "cpu")
        self.vllm_args = tuple(vllm_args)
        self.placement = dict(placement or {})
        self._process: subprocess.Popen[bytes] | None = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _command(self, python: Path) -> list[str]:
        return [str(python), "-m", "vllm.entrypoints.openai.api_server", *self.arguments()]

    def arguments(self) -> list[str]:
        """The API server's arguments: the model, where it listens, our flags, the user's, then LoRA's."""
        arguments = [
            "--model", str(self.model_dir), "--served-model-name", self.served_model_name,
            "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", str(self.max_model_len),
        ]  # fmt: skip
        arguments += server_flags(self.device, self.dtype, self.vllm_args)
        if self.lora_rank is not None:
            # One adapter slot: the policy's, replaced in place by each reload (runtime LoRA updating).
            arguments += ["--enable-lora", "--max-lora-rank", str(self.lora_rank), "--max-loras", "1"]
        return arguments

    # ≈30 s on an idle 2-core machine; beside another vLLM and a trainer on the same 2 cores, 300 s has
    # gone by before the weights loaded. Only a start that fails waits this long.
    def start(self, timeout_s: float = 600.0) -> Self:
        """Launch the server, wait for /health, warm it up; raises VLLMStartError with the end of its log."""
        python = vllm_python("cuda" if self.device == "cuda" else "cpu")
        if self.log_path is None:  # a temporary log, removed by stop()
            self._scratch = tempfile.TemporaryDirectory(prefix="otel-rl-vllm-")
            self.log_path = Path(self._scratch.name) / "vllm.log"
        # Persistent caches inside the environment: the first request with logprobs compiles a kernel with
        # torch inductor (≈30-50 s on 2 busy cores); later servers load it from here.
        caches = python.parent.parent / "runtime-cache"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env |= (
            SERVER_ENV
            | (CPU_ENV if self.device == "cpu" else {})
            | self.placement
            | {
                "VLLM_CACHE_ROOT": str(caches / "vllm"),  # else vLLM writes under ~/.cache/vllm
                "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
            }
        )
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                self._command(python), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            if (exit_code := self._process.poll()) is not None:
                raise self._start_failure(f"exited with code {exit_code}")
            if time.monotonic() > deadline:
                raise self._start_failure(f"was not healthy after {timeout_s:g} s")
            time.sleep(0.5)
        self._warm_up(deadline)
        return self

    def _warm_up(self, deadline: float) -> None:
        """One sampled request with logprobs, so that its one-time kernel compilation happens here."""
        body = {
            "model": self.served_model_name,
            "prompt": [0],
            "max_tokens": 2,
            "logprobs": 1,
            "temperature": 1,
        }
        try:
            response = httpx.post(
                f"{self.url}/v1/completions", json=body, timeout=max(deadline - time.monotonic(), 1)
            )
            response.raise_for_status()
        except httpx.HTTPError as error:
            raise self._start_failure(f"failed its warm-up request ({error})") from error

    def _start_failure(self, reason: str) -> VLLMStartError:
        kept_log = "" if self._scratch else f" ({self.log_path})"  # a temporary log goes with stop()
        error = VLLMStartError(
            f"vLLM for {self.model_dir} {reason}; end of its log{kept_log}:\n{tail(self.log_path)}"
        )
        self.stop()
        return error

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (vLLM then stops its engine and worker), then SIGKILL whatever is left of its processes."""
        if self._process is not None:
            if self._process.poll() is None:
                self._process.send_signal(signal.SIGTERM)
                with suppress(subprocess.TimeoutExpired):
                    self._process.wait(timeout_s)
            with suppress(ProcessLookupError):  # the group is empty after a clean shutdown
                os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
            self._process = None
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch, self.log_path = None, None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
