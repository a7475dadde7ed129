"""Offline training from the store: RL on stored rollouts (`--offline --where`), SFT from traces (`--sft`)."""

import json
import random
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import polars as pl
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from otel_rl import attributes as attr
from otel_rl.train.backend import TrainerBackend, make_trainer
from otel_rl.train.config import TrainConfig
from otel_rl.train.records import RunRecorder, UpdateRecord

METRICS_FILE = "metrics.jsonl"  # in output_dir: one JSON object per step


def stored_samples(
    config: TrainConfig, where: str, tokenizer: Any = None, dbs: Sequence[Path] = ()
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(samples, calls) of the stored rollouts matching `where` (see otel_rl.transforms.build_samples), read
    from the stores `dbs` (files or globs, read as one), else `server.db`, else the server.

    With a tokenizer, the calls' messages are read too, calls recorded without token ids are retokenized,
    and the result can be exported as chats for SFT.
    """
    from otel_rl.query import query
    from otel_rl.transforms.rewards import trust_setting
    from otel_rl.transforms.samples import SampleOptions, build_samples, load_inputs

    stores = list(dbs) or ([config.server.db] if config.server.db else [])
    server, db = (None, stores) if stores else (config.server.url, None)

    run = partial(query, db=db, server=server, token=config.server.token)
    calls, rollouts, rewards = load_inputs(where, run, messages=tokenizer is not None)
    reward = config.reward
    options = SampleOptions(
        reward=reward.spec(),
        estimator=config.algorithm.advantage_estimator,
        drift_sample=0,
    )
    samples, report = build_samples(calls, rollouts, rewards, tokenizer=tokenizer, options=options)
    if samples.height == 0:
        raise ValueError(
            f"no usable samples among the rollouts where {where}: dropped {report.why_dropped(trust_setting)}"
        )
    return samples, calls


def group_batches(samples: pl.DataFrame, groups_per_step: int, seed: int) -> Iterator[pl.DataFrame]:
    """Endless batches of `groups_per_step` whole groups (a GRPO baseline needs its whole group), seeded."""
    group = pl.col("group_id").fill_null(pl.col("rollout_id"))
    groups = samples.select(group).to_series().unique().sort().to_list()
    size = min(groups_per_step, len(groups))
    rng = random.Random(seed)
    while True:
        rng.shuffle(groups)
        for start in range(0, len(groups) - size + 1, size):
            yield samples.filter(group.is_in(groups[start : start + size]))


def step_recorder(config: TrainConfig, console: Console, mode: str) -> RunRecorder | None:
    """A recorder of this run's updates as step spans on the server (run id `<mode>-<random>`), so that the
    training page of the web view shows offline and SFT runs too; None (said) if no server takes the token."""
    import httpx

    from otel_rl.train.config import ConfigError
    from otel_rl.train.server_client import server_token

    url = config.server.url
    try:
        token = server_token(config)
        # an admin route: answers 200 only to the admin token, so steps never go to a server that refuses them
        headers = {"Authorization": f"Bearer {token}"}
        httpx.get(f"{url.rstrip('/')}/ui/api/training/runs", headers=headers, timeout=5).raise_for_status()
    except (ConfigError, httpx.HTTPError) as error:
        console.print(
            f"[yellow]not recording the steps on the server ({url}: {error}): metrics.jsonl only[/]"
        )
        return None
    run_id = f"{mode}-{uuid.uuid4().hex[:12]}"
    console.print(f"run {run_id}: its steps are on the web view's training page ({url}/ui#/training)")
    return RunRecorder(url, token, run_id)


def train_loop(
    config: TrainConfig,
    trainer: TrainerBackend,
    step: Callable[[], dict[str, float]],
    console: Console,
    label: str,
    recorder: RunRecorder | None = None,
) -> Path:
    """Run `step` `config.steps` times with a progress bar; metrics to output_dir/metrics.jsonl (and, with a
    recorder, each update as a step span on the server); checkpoints to output_dir/step-N every `save_every`
    steps and after the last. Returns the last checkpoint."""
    config.output_dir.mkdir(parents=True, exist_ok=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    checkpoint = config.output_dir / "step-0"
    with (
        (config.output_dir / METRICS_FILE).open("a") as log,
        Progress(*columns, TextColumn("{task.fields[m]}"), console=console) as progress,
    ):
        bar = progress.add_task(label, total=config.steps, m="")
        for number in range(1, config.steps + 1):
            started, started_ns = time.perf_counter(), time.time_ns()
            metrics = step() | {"step": number, "train_seconds": time.perf_counter() - started}
            log.write(json.dumps(metrics) + "\n")
            if recorder is not None:
                trained = {k: float(v) for k, v in metrics.items() if k not in ("step", "train_seconds")}
                update = UpdateRecord(number, number, metrics["train_seconds"], trained)
                recorder.record(attr.TRAIN_STEP_SPAN_NAME, update, started_ns, flush=False)
            progress.update(bar, advance=1, m=_brief(metrics))
            if number % config.save_every == 0 or number == config.steps:
                checkpoint = trainer.save(config.output_dir / f"step-{number}")
    return checkpoint


def _brief(metrics: dict[str, float]) -> str:
    shown = ("loss", "mismatch", "grad_norm")
    return "  ".join(f"{name} {metrics[name]:.4g}" for name in shown if name in metrics)


def offline_rl(config: TrainConfig, console: Console, dbs: Sequence[Path] = ()) -> Path:
    """`steps` RL updates on the stored rollouts matching `offline.where` (in the stores `dbs` when given,
    see stored_samples); returns the last checkpoint.

    Importance weights against the logprobs the gateway recorded correct for the rollouts being off-policy.
    """
    from otel_rl.transforms.export import to_dataproto

    config.require_offline()
    with console.status("reading samples from the store"):
        samples, _ = stored_samples(config, config.offline.where, dbs=dbs)
    console.print(f"{samples.height} samples from {samples['rollout_id'].n_unique()} rollouts")
    if not samples["has_logprobs"].all():
        console.print(
            "[yellow]some samples have no recorded logprobs: batches without importance correction[/]"
        )
    batches = group_batches(samples, config.algorithm.groups_per_step, config.seed)
    trainer = make_trainer(config)
    recorder = step_recorder(config, console, "offline")
    try:
        pad_id = trainer.tokenizer.pad_token_id

        def step() -> dict[str, float]:
            return trainer.step(to_dataproto(next(batches), pad_id))

        return train_loop(config, trainer, step, console, "offline RL", recorder)
    finally:
        trainer.close()
        if recorder is not None:
            recorder.close()


def sft_from_traces(config: TrainConfig, console: Console, dbs: Sequence[Path] = ()) -> Path:
    """SFT on the conversations of the stored rollouts matching `offline.where` (default: all) whose reward
    is at least `offline.min_reward` (default: any): rejection-sampling fine-tuning, from the stores `dbs`
    when given (see stored_samples). Or, with `offline.chats`, on the conversations of that chat JSONL file.
    Returns the last checkpoint."""
    from otel_rl.train.sft import read_chats, sft_batches
    from otel_rl.transforms.export import sft_records

    config.require_sft()
    trainer = make_trainer(config)
    recorder = None
    try:
        if config.offline.chats is not None:
            chats = read_chats(config.offline.chats)
        else:
            where = config.offline.where or "true"
            with console.status("reading conversations from the store"):
                samples = stored_samples(config, where, trainer.tokenizer, dbs)
                chats = sft_records(*samples, config.offline.min_reward)
            # The store returns rollouts in no set order (and their ids are random): sort, so that a seeded
            # run draws the same batches from the same conversations.
            chats.sort(key=lambda chat: json.dumps(chat, sort_keys=True))
        console.print(f"{len(chats)} conversations for SFT")
        batches = sft_batches(trainer.tokenizer, chats, config.offline.sft_batch_size, config.seed)
        recorder = step_recorder(config, console, "sft")
        return train_loop(config, trainer, lambda: trainer.sft_step(*next(batches)), console, "SFT", recorder)
    finally:
        trainer.close()
        if recorder is not None:
            recorder.close()
