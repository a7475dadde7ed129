"""The flags a local vLLM server runs with: ours, the model's own dtype, and vLLM flags passed through."""

import json
import os
import shlex
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Device = Literal["cpu", "cuda"]
CHECK_SCRIPT = Path(__file__).with_name("vllm_check_args.py")

# What every local server runs with (docs/model.md explains each): the sampling distribution's logprobs
# (temperature applied), only the sampling parameters a request sends, Hermes-style tool calls, which the tiny
# model's chat template writes, and usage with its cached tokens. (flag, value or None for a switch)
COMMON_FLAGS: tuple[tuple[str, str | None], ...] = (
    ("--logprobs-mode", "processed_logprobs"),
    ("--generation-config", "vllm"),
    ("--enable-auto-tool-choice", None),
    ("--tool-call-parser", "hermes"),
    ("--enable-prompt-tokens-details", None),
)
# On CPU only: eager mode starts in ≈26 s instead of 35-90 s (vLLM's CPU build otherwise traces the model with
# torch.compile), at the same speed for small models. On a GPU, vLLM's CUDA graphs are worth their start-up.
CPU_FLAGS: tuple[tuple[str, str | None], ...] = (("--enforce-eager", None),)
# The dtypes a config.json may declare that vLLM's --dtype takes as they are.
DTYPES = ("float32", "bfloat16", "float16")
# Flags that otel-rl sets from its own (the gateway relies on them, or otel-rl checks them first).
RESERVED = {
    "--model": "it is --model",
    "--served-model-name": "the gateway names the model itself",
    "--host": "the server binds 127.0.0.1, behind the gateway",
    "--port": "each replica gets a free port",
    "--api-key": "the gateway calls its servers without one; they listen on loopback only",
    "--max-model-len": "use otel-rl's --max-model-len (checked against the model's config)",
    "--enable-lora": "use --lora-rank",
    "--max-lora-rank": "use --lora-rank",
    "--max-loras": "use --lora-rank",
}


class VLLMArgsRejected(ValueError):
    """vLLM's own argument parser refused the flags passed through with --vllm-arg."""


@dataclass(frozen=True)
class ParsedArgs:
    """What vLLM's parser made of a server's command: what sizes each replica."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1

    @property
    def ranks(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size


def declared_dtype(config: dict) -> str | None:
    """The dtype a model's config.json declares (`dtype`, transformers 5; `torch_dtype` before), if vLLM
    takes it as is; None: let vLLM choose ("auto", which would also turn float32 into bfloat16)."""
    value = config.get("dtype") or config.get("torch_dtype")
    return value if value in DTYPES else None


def flag_name(token: str) -> str | None:
    """`--Some_flag=x` → `--some-flag`; None for a value. `--no-X` names X (vLLM's boolean switches)."""
    if not token.startswith("--"):
        return None
    name = "--" + token[2:].split("=", 1)[0].replace("_", "-")
    return "--" + name.removeprefix("--no-") if name.startswith("--no-") else name


def user_args(values: Iterable[str]) -> tuple[str, ...]:
    """The --vllm-arg values as argv tokens (each split like a shell would: `--vllm-arg="-tp 2"` works too);
    raises ValueError naming a flag that otel-rl sets itself."""
    tokens = tuple(token for value in values for token in shlex.split(value))
    for token in tokens:
        if (name := flag_name(token)) in RESERVED:
            raise ValueError(f"--vllm-arg {token}: otel-rl sets {name} itself ({RESERVED[name]})")
    return tokens


def server_flags(device: Device, dtype: str | None, passed: Sequence[str]) -> list[str]:
    """Our flags for `device` and the model's dtype, less those the user's own flags replace, then theirs."""
    defaults = [*COMMON_FLAGS, *(CPU_FLAGS if device == "cpu" else ())]
    if dtype is not None:
        defaults.insert(0, ("--dtype", dtype))
    replaced = {name for token in passed if (name := flag_name(token))}
    flags = []
    for flag, value in defaults:
        if flag not in replaced:
            flags += [flag] if value is None else [flag, value]
    return [*flags, *passed]


def check_with_vllm(
    python: Path, arguments: Sequence[str], passed: Sequence[str], timeout_s: float = 300.0
) -> ParsedArgs:
    """Parse a server's `arguments` with vLLM's own parser and its pre-start checks, in vLLM's environment
    (importing vLLM there takes seconds to tens of seconds; nothing starts); raises VLLMArgsRejected with
    vLLM's message, which names the flag, and the flags the user `passed`."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env |= {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(  # -I: not the script's folder first on the path (its vllm.py would shadow vLLM)
        [str(python), "-I", str(CHECK_SCRIPT), *arguments],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["(no message)"]
        reason = next((line for line in reversed(lines) if "error:" in line.lower()), lines[-1])
        raise VLLMArgsRejected(f"--vllm-arg {shlex.join(passed)}: vLLM rejects it: {reason.strip()}")
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    return ParsedArgs(**{key: int(value or 1) for key, value in parsed.items()})
