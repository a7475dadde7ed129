"""Colocated mode measured: `otel-rl serve --model DIR --colocated` (vLLM behind the gateway on the devices
the trainer uses) through a few updates: the pause per update and its parts, the device memory the sleeping
server gives back, and the gateway's tokens/s before and after.

    bench/gpu/colocated.py [--updates 3] [--json FILE]   on a GPU machine with otel-rl and its CUDA vLLM
                                                         environment (`otel-rl vllm setup`)
    bench/gpu/colocated.py --cpu --tiny                  here: the same on vLLM's CPU build and the tiny
                                                         model (vLLM's CPU worker ignores sleep: 0 freed)

The policy is a seeded, random-initialized Qwen2 of Qwen2.5-0.5B's shape (494M parameters, bfloat16;
`--tiny`: the project's tiny model), built here, no downloads. Each update is what the online loop does in
colocated mode: `POST /v1/admin/policy/sleep` (drain, vLLM `/sleep?level=1`), the "trainer" (the weights
loaded onto the device, moved by seeded noise, saved as the next checkpoint), `POST /v1/admin/policy/wake`
(vLLM `/wake_up`, reload_weights, verify, resume). Calls sent during the update must wait, not fail. vLLM's
own sleep + wake is timed first, on the server directly, with no traffic: the issue's aim is a pause over the
trainer's time within 2x of it (`overhead_ratio`).
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from otel_rl.gateway.vllm import free_ports  # noqa: E402
from otel_rl.tinymodel import TinyModelShape, init_model  # noqa: E402

# Qwen2.5-0.5B's shape (its 151936-token vocabulary too: the model's memory is the real one's).
FULL_SHAPE = TinyModelShape(
    hidden=896, layers=24, heads=14, kv_heads=2, head_dim=64, mlp=4864, max_positions=4096
)
FULL_VOCAB = 151936
TOKEN = "colocated-bench-token"
MODEL_NAME = "policy"  # what vLLM serves the model as; read from the gateway at the start
PROMPT = "What is 37 + 48? Answer with the number and a short explanation."


def build_model(folder: Path, tiny: bool) -> Path:
    """The tiny model, or the tiny model's tokenizer with a random 0.5B-shaped Qwen2 in bfloat16."""
    init_model(folder / "tokenizer-model", seed=0)
    if tiny:
        return folder / "tokenizer-model"
    import torch
    from transformers import AutoConfig, Qwen2ForCausalLM

    model_dir = folder / "model"
    shutil.copytree(folder / "tokenizer-model", model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    shape = FULL_SHAPE
    config.update(
        {
            "hidden_size": shape.hidden,
            "intermediate_size": shape.mlp,
            "num_hidden_layers": shape.layers,
            "num_attention_heads": shape.heads,
            "num_key_value_heads": shape.kv_heads,
            "head_dim": shape.head_dim,
            "max_position_embeddings": shape.max_positions,
            "vocab_size": FULL_VOCAB,
            "dtype": "bfloat16",
        }
    )
    for stale in model_dir.glob("*.safetensors"):
        stale.unlink()
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(model_dir)
    return model_dir


def train_step(previous: Path, target: Path, seed: int) -> float:
    """The trainer's stand-in on the freed devices: weights onto the device, moved, saved; its seconds."""
    import torch
    from safetensors.torch import load_file, save_file

    started = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shutil.copytree(previous, target, ignore=shutil.ignore_patterns("*.safetensors"))
    generator = torch.Generator(device).manual_seed(seed)
    for file in sorted(previous.glob("*.safetensors")):
        tensors = load_file(file, device=device)
        for tensor in tensors.values():
            noise = torch.randn(tensor.shape, generator=generator, device=device, dtype=torch.float32)
            tensor.add_((noise * 1e-3).to(tensor.dtype))
        save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, target / file.name)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def device_memory_mib(vllm_pids: list[int]) -> float:
    """Memory the devices hold: the GPUs' used memory (nvidia-smi), else the vLLM processes' resident set."""
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return float(sum(float(line) for line in out.split()))
    import psutil

    return sum(psutil.Process(pid).memory_info().rss for pid in vllm_pids if psutil.pid_exists(pid)) / 2**20


def child_pids(pid: int) -> list[int]:
    import psutil

    return [child.pid for child in psutil.Process(pid).children(recursive=True)]


def tokens_per_s(gateway: str, calls: int, max_tokens: int) -> float:
    """Completion tokens per second of `calls` concurrent chat calls through the gateway."""
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(calls) as pool:
        tokens = sum(pool.map(lambda _: chat(gateway, max_tokens), range(calls)))
    return tokens / (time.perf_counter() - started)


def chat(gateway: str, max_tokens: int) -> int:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens,
            "temperature": 1.0}  # fmt: skip
    response = httpx.post(f"{gateway}/v1/chat/completions", json=body, headers=auth(), timeout=600)
    response.raise_for_status()
    return response.json()["usage"]["completion_tokens"]


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def admin(gateway: str, method: str, path: str, **kwargs) -> dict:
    response = httpx.request(method, gateway + path, headers=auth(), timeout=1800, **kwargs)
    if response.status_code != 200:
        raise RuntimeError(f"{method} {path}: HTTP {response.status_code} {response.text[:500]}")
    return response.json()


def start_server(model: Path, workdir: Path, cpu: bool) -> tuple[subprocess.Popen, str]:
    """`otel-rl serve --model MODEL --colocated`, once its vLLM server is available behind the gateway."""
    http_port, grpc_port = free_ports(2)
    otel_rl = Path(sys.executable).parent / "otel-rl"
    args = [str(otel_rl), "serve", "--db", str(workdir / "bench.duckdb"), "--token", TOKEN,
            "--model", str(model), "--http-port", str(http_port), "--grpc-port", str(grpc_port),
            "--colocated"]  # fmt: skip
    if cpu:
        args.append("--max-model-len=512")  # vLLM's CPU KV cache (VLLM_CPU_KVCACHE_SPACE) holds this much
    log = (workdir / "serve.log").open("ab")
    process = subprocess.Popen(
        args, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    gateway = f"http://127.0.0.1:{http_port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"otel-rl serve exited: {(workdir / 'serve.log').read_text()[-3000:]}")
        try:
            servers = admin(gateway, "GET", "/v1/admin/policy")["servers"]
            if servers and all(s["available"] for s in servers):
                return process, gateway
        except (httpx.TransportError, RuntimeError):
            pass
        time.sleep(1)
    raise TimeoutError("vLLM did not become available behind the gateway in 900 s")


def vllm_sleep_wake_s(server: str) -> float:
    """vLLM's own sleep + wake (level 1), on the server directly, with nothing in flight."""
    started = time.perf_counter()
    for path in ("/sleep?level=1", "/wake_up"):
        httpx.post(server + path, timeout=600).raise_for_status()
    return time.perf_counter() - started


def run(args: argparse.Namespace, workdir: Path) -> dict:
    model = build_model(workdir, args.tiny)
    process, gateway = start_server(model, workdir, args.cpu)
    try:
        policy = admin(gateway, "GET", "/v1/admin/policy")
        [server] = [s["url"] for s in policy["servers"]]
        global MODEL_NAME
        MODEL_NAME = httpx.get(f"{gateway}/v1/models", headers=auth(), timeout=30).json()["data"][0]["id"]
        vllm_pids = child_pids(process.pid) if args.cpu else []
        chat(gateway, 8)  # warm-up
        before = tokens_per_s(gateway, args.calls, args.max_tokens)
        own = vllm_sleep_wake_s(server)
        updates, checkpoint = [], model
        for version in range(1, args.updates + 1):
            awake_mib = device_memory_mib(vllm_pids)
            asleep = admin(gateway, "POST", "/v1/admin/policy/sleep")
            asleep_mib = device_memory_mib(vllm_pids)
            with concurrent.futures.ThreadPoolExecutor(args.calls) as pool:  # arrive during the update: wait
                waiting = [pool.submit(chat, gateway, 8) for _ in range(args.calls)]
                target = workdir / f"step-{version}"
                update_s = train_step(checkpoint, target, seed=version)
                woken = admin(gateway, "POST", "/v1/admin/policy/wake",
                              json={"version": version, "checkpoint": str(target)})  # fmt: skip
                waited = [future.exception() is None and future.result() > 0 for future in waiting]
            checkpoint = target
            pause_s = woken["colocated_pause_ms"] / 1000
            updates.append(
                {"version": version, "pause_s": pause_s, "update_s": update_s,
                 "overhead_s": pause_s - update_s, "drain_s": asleep["drain_ms"] / 1000,
                 "sleep_s": woken["sleep_ms"] / 1000,
                 "wake_s": woken["wake_ms"] / 1000, "reload_s": woken["reload_ms"] / 1000,
                 "verify_s": woken["verify_ms"] / 1000, "memory_awake_mib": awake_mib,
                 "memory_asleep_mib": asleep_mib, "memory_freed_mib": awake_mib - asleep_mib,
                 "calls_during_update": len(waited), "calls_failed_during_update": waited.count(False),
                 "servers_ok": [s["ok"] for s in woken["servers"]]}
            )  # fmt: skip
            print(json.dumps(updates[-1]), flush=True)
        after = tokens_per_s(gateway, args.calls, args.max_tokens)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)
    overheads = [u["overhead_s"] for u in updates]
    return {
        "device": "cpu" if args.cpu else "cuda",
        "model": "tiny" if args.tiny else "qwen2.5-0.5b-shape (random, bfloat16)",
        "tokens_per_s_before": before,
        "tokens_per_s_after": after,
        "vllm_sleep_wake_s": own,
        "overhead_ratio": max(overheads) / own if own > 0 else None,  # aim: ≤ 2
        "updates": updates,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="vLLM's CPU build (sleep frees nothing there)")
    parser.add_argument("--tiny", action="store_true", help="the project's tiny model, not the 0.5B shape")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument(
        "--calls", type=int, default=8, help="concurrent calls for tokens/s and during updates"
    )
    parser.add_argument("--max-tokens", type=int, default=None, help="per call (default 256; --tiny 32)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    args.max_tokens = args.max_tokens or (32 if args.tiny else 256)
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            parser.error("no CUDA device here: run with --cpu --tiny, or on a GPU machine")
    with tempfile.TemporaryDirectory(prefix="otel-rl-colocated-") as workdir:
        results = run(args, Path(workdir))
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
