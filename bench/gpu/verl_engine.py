"""verl's own actor engine (FSDP2, world size 1) beside the local trainer, on the same batches: tokens/s, peak
device memory and the loss and gradient norm of each update from both.

Run by bench/gpu/verl_engine.sh (which prepares the environment; read it first). The policy is a seeded,
random-initialized Qwen2 of Qwen2.5-0.5B's shape (494M parameters; `--tiny`: a 1M-parameter one) built here,
no downloads; the batches are seeded random token ids. Both backends start from the same float32 weights:
the local trainer (otel_rl.train.trainer.Trainer) computes in float32, verl's engine in bfloat16 on a GPU
(float32 master weights and gradient reduction, its defaults) and in float32 with `--cpu`.

Both run the same objective, the one otel-rl's backends use. Each batch carries "served" log-probabilities
(the initial policy's plus seeded noise, standing in for what vLLM recorded); the old policy is the current
one (one PPO epoch), and each token is weighted by the truncated ratio pi_old / pi_served (`rollout_is:
token`). The local trainer takes the old log-probs from its update's own forward pass; verl's engine, as the
verl backend does, from a forward pass of its own first (`infer_batch`), then updates with those weights in
`rollout_is_weights`. The losses depend on the weights through pi_old, so equal columns mean equal updates.
"""

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

# Qwen2.5-0.5B's shape, random weights; `--tiny`: the project's tiny model's shape (otel_rl.tinymodel).
FULL_SHAPE = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096)  # fmt: skip
TINY_SHAPE = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=64, vocab_size=1024)  # fmt: skip
LEARNING_RATE = 1e-5
ROLLOUT_IS_THRESHOLD = 2.0  # the truncation of the importance weight pi_old / pi_served (TIS)
SERVED_NOISE = 0.02  # std of the served log-probs' offset from the initial policy's: well inside the clip


@dataclass(frozen=True)
class BatchShape:
    samples: int  # sequences per update (one optimizer step)
    prompt: int  # prompt tokens of each sequence
    response: int  # response tokens of each sequence
    micro: int  # sequences per forward/backward

    @property
    def tokens(self) -> int:
        return self.samples * (self.prompt + self.response)


FULL_BATCH = BatchShape(samples=32, prompt=256, response=768, micro=8)
TINY_BATCH = BatchShape(samples=4, prompt=8, response=16, micro=2)


@dataclass
class Update:
    """One optimizer step of one backend."""

    loss: float
    grad_norm: float
    seconds: float
    tokens_per_s: float


def build_model(directory: Path, *, tiny: bool, seed: int) -> int:
    """A seeded random Qwen2 in float32 safetensors, with the project's offline tokenizer (the local trainer
    loads one; the batches do not use it)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from otel_rl.tinymodel import build_tokenizer

    # Tied input and output embeddings, as Qwen2.5-0.5B has them (494M parameters).
    config = Qwen2Config(**(TINY_SHAPE if tiny else FULL_SHAPE), tie_word_embeddings=True, dtype="float32")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.save_pretrained(directory)
    build_tokenizer().save_pretrained(directory)
    return model.num_parameters()


def make_batches(shape: BatchShape, *, vocab: int, n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    """`n` batches of seeded random token ids, every sequence full length (no padding: both backends do the
    same work), one advantage per sequence as GRPO gives."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        length = shape.prompt + shape.response
        input_ids = torch.randint(0, vocab, (shape.samples, length), generator=generator)
        advantages = torch.randn(shape.samples, 1, generator=generator).expand(-1, shape.response)
        batches.append(
            {
                "input_ids": input_ids,
                "attention_mask": torch.ones_like(input_ids),
                "position_ids": torch.arange(length).expand(shape.samples, -1).contiguous(),
                "prompts": input_ids[:, : shape.prompt].contiguous(),
                "responses": input_ids[:, shape.prompt :].contiguous(),
                "response_mask": torch.ones(shape.samples, shape.response, dtype=torch.int64),
                "advantages": advantages.contiguous(),
            }
        )
    return batches


def to_dataproto(tensors: dict[str, torch.Tensor], **extra: torch.Tensor):
    """The batch as verl's DataProto, with what each backend reads besides the samples themselves."""
    from verl import DataProto

    tensors = {k: v.clone() for k, v in tensors.items() if k != "served_log_probs"} | extra
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def peak_memory_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None


def run_local(model: Path, batches: list[dict], shape: BatchShape, device: str, seed: int) -> list[Update]:
    """The local backend: otel_rl.train.trainer.Trainer.step on each batch (served log-probs as vLLM's)."""
    from otel_rl.train.config import config_from_dict
    from otel_rl.train.trainer import Trainer

    config = config_from_dict(
        {
            "model": str(model),
            "device": device,
            "seed": seed,
            "steps": len(batches),
            "torch_threads": max(1, torch.get_num_threads()),
            "optim": {"lr": LEARNING_RATE, "micro_batch_size": shape.micro},
            "algorithm": {"rollout_is": "token", "rollout_is_threshold": ROLLOUT_IS_THRESHOLD},
        }
    )
    trainer = Trainer(config)
    updates = []
    for tensors in batches:
        batch = to_dataproto(tensors, rollout_log_probs=tensors["served_log_probs"])
        synchronize(device)
        started = time.perf_counter()
        metrics = trainer.step(batch)
        synchronize(device)
        seconds = time.perf_counter() - started
        updates.append(Update(metrics["loss"], metrics["grad_norm"], seconds, shape.tokens / seconds))
    del trainer
    return updates


def served_log_probs(model: Path, batches: list[dict], shape: BatchShape, device: str, seed: int) -> None:
    """What vLLM would have recorded: the initial policy's float32 log-probs of each response, plus noise."""
    from transformers import AutoModelForCausalLM
    from verl.utils.torch_functional import logprobs_from_logits

    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(device).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for tensors in batches:
            parts = []
            for rows in range(0, shape.samples, shape.micro):
                ids = tensors["input_ids"][rows : rows + shape.micro].to(device)
                logits = policy(input_ids=ids).logits[:, shape.prompt - 1 : -1]
                parts.append(logprobs_from_logits(logits, ids[:, shape.prompt :]).float().cpu())
            noise = SERVED_NOISE * torch.randn(shape.samples, shape.response, generator=generator)
            tensors["served_log_probs"] = torch.cat(parts) + noise
    del policy


def verl_worker(model: Path, shape: BatchShape, *, cpu: bool):
    """verl's TrainingWorker with its FSDP2 engine, configured from verl's own ppo_trainer.yaml the way
    ActorRolloutRefWorker.init_model configures its actor."""
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import TrainingWorkerConfig
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import ppo_loss

    actor = "actor_rollout_ref.actor"
    overrides = [
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",  # the local trainer has none
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",  # no flash-attn on the machine
        "actor_rollout_ref.rollout.n=1",
        f"{actor}.strategy=fsdp2",
        f"{actor}.ppo_mini_batch_size={shape.samples}",  # one optimizer step per batch
        f"{actor}.ppo_micro_batch_size_per_gpu={shape.micro}",
        f"{actor}.ppo_epochs=1",
        f"{actor}.use_torch_compile=false",
        f"{actor}.optim.lr={LEARNING_RATE}",
        f"{actor}.optim.weight_decay=0.0",  # the local trainer's AdamW default
        f"{actor}.fsdp_config.model_dtype=fp32",
    ]
    if cpu:  # float32 compute: verl otherwise computes in bf16 whatever fsdp_config.dtype says
        overrides.append(
            f"+{actor}.fsdp_config.mixed_precision={{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}}"
        )
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    actor_config = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    actor_config.model_config = model_config
    worker_config = TrainingWorkerConfig(
        model_type="language_model",
        model_config=model_config,
        engine_config=actor_config.engine,
        optimizer_config=actor_config.optim,
        checkpoint_config=actor_config.checkpoint,
    )
    engine = worker_config.engine_config
    engine.use_dynamic_bsz = False
    engine.micro_batch_size_per_gpu = shape.micro
    engine.infer_micro_batch_size_per_gpu = shape.micro
    engine.use_remove_padding = False
    if cpu and not torch.distributed.is_initialized():
        # verl would ask for "cpu:gloo,cpu:gloo" (its CPU and device backends), which torch refuses.
        torch.distributed.init_process_group("gloo")
    worker = TrainingWorker(config=worker_config)
    worker.reset()
    worker.set_loss_fn(partial(ppo_loss, config=actor_config))
    return worker


def verl_config_dir() -> Path:
    import verl

    return Path(verl.__file__).parent / "trainer" / "config"


def run_verl(model: Path, batches: list[dict], shape: BatchShape, device: str) -> list[Update]:
    """verl's engine, each step as the verl backend's: the old policy's log-probs from the engine
    (`infer_batch`, as ray_trainer._compute_old_log_prob), the truncated importance weights against the served
    ones, then one update (`train_mini_batch`, as ray_trainer._update_actor: no padding, one mini-batch)."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    worker = verl_worker(model, shape, cpu=device == "cpu")
    updates = []
    for tensors in batches:
        synchronize(device)
        started = time.perf_counter()
        data = left_right_2_no_padding(to_dataproto(tensors).to_tensordict())
        tu.assign_non_tensor(data, calculate_entropy=False, compute_loss=False)
        old = no_padding_2_padding(tu.get(worker.infer_batch(data), "log_probs"), data).float()
        weights, _ = compute_rollout_correction_weights(
            log_ratio=old - tensors["served_log_probs"],
            response_mask=tensors["response_mask"].float(),
            rollout_is="token",
            rollout_is_threshold=ROLLOUT_IS_THRESHOLD,
        )
        data = left_right_2_no_padding(
            to_dataproto(tensors, old_log_probs=old, rollout_is_weights=weights).to_tensordict()
        )
        tu.assign_non_tensor(
            data,
            calculate_entropy=False,
            global_batch_size=shape.samples,
            mini_batch_size=shape.samples,
            epochs=1,
            seed=0,
            dataloader_kwargs={"shuffle": False},
            compute_loss=True,
        )
        metrics = tu.get(worker.train_mini_batch(data), "metrics")
        synchronize(device)
        seconds = time.perf_counter() - started
        [loss], [grad_norm] = metrics["loss"], metrics["grad_norm"]
        updates.append(Update(loss, grad_norm, seconds, shape.tokens / seconds))
    del worker
    return updates


def measure(*, cpu: bool, tiny: bool, updates: int, seed: int, workdir: Path) -> dict:
    device = "cpu" if cpu else "cuda"
    shape = TINY_BATCH if tiny else FULL_BATCH
    model = workdir / "model"
    parameters = build_model(model, tiny=tiny, seed=seed)
    vocab = (TINY_SHAPE if tiny else FULL_SHAPE)["vocab_size"]
    batches = make_batches(shape, vocab=vocab, n=updates, seed=seed)
    served_log_probs(model, batches, shape, device, seed)
    results = {}
    for name, run in (
        ("local", lambda: run_local(model, batches, shape, device, seed)),
        ("verl", lambda: run_verl(model, batches, shape, device)),
    ):
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        steps = run()
        results[name] = {"updates": [asdict(u) for u in steps], "peak_memory_gib": peak_memory_gib(device)}
    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "parameters": parameters,
        "batch": asdict(shape) | {"tokens": shape.tokens},
        **results,
    }


def report(result: dict) -> str:
    lines = [
        f"{result['device']}, torch {result['torch']}, {result['parameters'] / 1e6:.0f}M parameters, "
        f"{result['batch']['samples']} sequences x {result['batch']['prompt']}+{result['batch']['response']} "
        f"tokens = {result['batch']['tokens']} tokens an update",
        f"{'update':>6} {'local loss':>12} {'verl loss':>12} {'local |g|':>10} {'verl |g|':>10} "
        f"{'local tok/s':>12} {'verl tok/s':>12}",
    ]
    for i, (local, verl) in enumerate(
        zip(result["local"]["updates"], result["verl"]["updates"], strict=True)
    ):
        lines.append(
            f"{i + 1:>6} {local['loss']:>12.6f} {verl['loss']:>12.6f} {local['grad_norm']:>10.4f} "
            f"{verl['grad_norm']:>10.4f} {local['tokens_per_s']:>12.0f} {verl['tokens_per_s']:>12.0f}"
        )
    for name in ("local", "verl"):
        steady = result[name]["updates"][1:] or result[name]["updates"]
        rate = sum(u["tokens_per_s"] for u in steady) / len(steady)
        peak = result[name]["peak_memory_gib"]
        memory = f"{peak:.1f} GiB peak allocated" if peak is not None else "peak memory n/a on CPU"
        lines.append(f"{name}: {rate:.0f} tokens/s after the first update; {memory}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cpu", action="store_true", help="CPU, float32, gloo (the proof run without a GPU)")
    parser.add_argument("--tiny", action="store_true", help="a 1M-parameter model and a small batch")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    # World size 1 on loopback, as torchrun sets it for one process (verl's process group reads these).
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    if args.cpu:
        # verl's CPU platform and engine registration, as the verl backend uses them on CPU (registered on
        # import, before verl.workers.engine reads the device name).
        os.environ["VERL_PLATFORM"] = "cpu"
        import otel_rl.train.verl.platform  # noqa: F401
    with tempfile.TemporaryDirectory(prefix="otel-rl-gpu-check-") as tmp:
        result = measure(
            cpu=args.cpu, tiny=args.tiny, updates=args.updates, seed=args.seed, workdir=Path(tmp)
        )
    result["imported"] = {
        name: getattr(sys.modules.get(name), "__file__", None) for name in ("ray", "vllm", "duckdb")
    }
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":
    main()
