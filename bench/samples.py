"""Store -> padded training arrays for 512 rollouts x 8 turns, against NumPy's copy of the same tokens.

Gateway-style calls (exact token ids and logprobs as packed attributes, GenAI messages, rollout identity, a
controller rollout span, grader rewards) are encoded as OTLP, ingested into a temporary store through the real
collector path, then read back through the views and turned into padded arrays, on one core. The retokenizing
path is timed separately against the tokenizer's own batch-encode rate. Times are CPU seconds of this process
pinned to one core, so that other work on a shared machine does not skew them.

Also: an online step's read (train/groups.py read_groups: 8 groups' final attempts, their gateway calls from
`llm_calls` and rewards from `rewards`, bounded by the attempts' start), with older copies of the rollouts
stored under them, against the same read over a store holding only the step's rollouts.

Usage: python bench/samples.py [--rollouts 512] [--turns 8] [--retok-rollouts 64] [--history 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from rich.console import Console
from rich.progress import track
from rich.table import Table

from otel_rl import attributes as names
from otel_rl.collector.ingest import ingest_logs, ingest_traces
from otel_rl.collector.rewards import RewardIn, reward_log_request
from otel_rl.store import Store
from otel_rl.store.connection import connect
from otel_rl.store.sandbox import Params
from otel_rl.train.groups import read_groups
from otel_rl.transforms.export import pad, to_dataproto
from otel_rl.transforms.merge import flat_lists
from otel_rl.transforms.samples import SampleOptions, build_samples, load_inputs

WORDS = [f"w{i}" for i in range(2000)]
PAD_ID = 0
T0 = 1_700_000_000_000_000_000  # the rollouts' start (ns); history is older
HOUR_NS = 3600 * 10**9
RESPONSE_DTYPES = {"response_ids": np.int64, "response_mask": np.int64, "rollout_logprobs": np.float32}


@dataclass
class Call:
    """One generated model call: token ids (exact) and the messages they stand for."""

    prompt: np.ndarray
    completion: np.ndarray
    logprobs: np.ndarray
    messages: list[dict]
    answer: dict


def text(rng: np.random.Generator, n_tokens: int) -> str:
    """About one word per token: message JSON as large as the token arrays make it."""
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), n_tokens))


def rollout_calls(rng: np.random.Generator, turns: int) -> list[Call]:
    """A multi-turn agent: ~1K-token first prompt, 64-256-token answers, 16-64-token tool results."""
    context = rng.integers(10, 30000, 1024, dtype=np.int32)
    messages = [{"role": "system", "parts": [{"type": "text", "content": text(rng, 1024)}]}]
    calls = []
    for _ in range(turns):
        completion = rng.integers(10, 30000, int(rng.integers(64, 257)), dtype=np.int32)
        logprobs = -rng.random(completion.size, dtype=np.float32)
        answer = {"role": "assistant", "parts": [{"type": "text", "content": text(rng, completion.size)}]}
        calls.append(Call(context, completion, logprobs, list(messages), answer))
        tool = rng.integers(10, 30000, int(rng.integers(16, 65)), dtype=np.int32)
        context = np.concatenate([context, completion, tool])
        messages += [answer, {"role": "tool", "parts": [{"type": "text", "content": text(rng, tool.size)}]}]
    return calls


def kv(key: str, value: str | int | bytes) -> KeyValue:
    if isinstance(value, bytes):
        return KeyValue(key=key, value=AnyValue(bytes_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def traces_request(
    rollouts: list[tuple[str, str, list[Call]]], *, with_ids: bool, t0: int
) -> ExportTraceServiceRequest:
    """Gateway call spans and the controller's rollout span of each rollout, as one OTLP request."""
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    gateway = resource.scope_spans.add()
    gateway.scope.name = names.GATEWAY_SCOPE
    controller = resource.scope_spans.add()
    controller.scope.name = names.CONTROLLER_SCOPE
    for rollout_id, group_id, calls in rollouts:
        trace_id = os.urandom(16)
        root_id = os.urandom(8)
        identity = [kv(names.ROLLOUT_ID, rollout_id), kv(names.GROUP_ID, group_id), kv(names.TASK_ID, "task")]
        end = t0 + (len(calls) + 1) * 1_000_000
        controller.spans.append(
            Span(
                trace_id=trace_id,
                span_id=root_id,
                name=names.ROLLOUT_SPAN_NAME,
                kind=Span.SPAN_KIND_INTERNAL,
                start_time_unix_nano=t0,
                end_time_unix_nano=end,
                attributes=[*identity, kv(names.ROLLOUT_STATUS, "ok"), kv(names.ROLLOUT_EXIT_CODE, 0)],
            )
        )
        for turn, call in enumerate(calls):
            attributes = [
                *identity,
                kv("gen_ai.operation.name", "chat"),
                kv("gen_ai.provider.name", "vllm"),
                kv("gen_ai.request.model", "tiny"),
                kv("gen_ai.input.messages", json.dumps(call.messages)),
                kv("gen_ai.output.messages", json.dumps([{**call.answer, "finish_reason": "stop"}])),
                kv("gen_ai.response.finish_reasons", json.dumps(["stop"])),
                kv(names.POLICY_VERSION, 1),
            ]
            if with_ids:
                attributes += [
                    kv(names.PROMPT_TOKEN_IDS, call.prompt.astype("<i4").tobytes()),
                    kv(names.CHOICE_TOKEN_IDS.format(i=0), call.completion.astype("<i4").tobytes()),
                    kv(names.CHOICE_LOGPROBS.format(i=0), call.logprobs.astype("<f4").tobytes()),
                ]
            gateway.spans.append(
                Span(
                    trace_id=trace_id,
                    span_id=os.urandom(8),
                    parent_span_id=root_id,
                    name="chat tiny",
                    kind=Span.SPAN_KIND_CLIENT,
                    start_time_unix_nano=t0 + (turn + 1) * 1_000_000,
                    end_time_unix_nano=t0 + (turn + 1) * 1_000_000 + 500_000,
                    attributes=attributes,
                    status=Status(),
                )
            )
    return request


def fill_store(
    store: Store, rollouts: list[tuple[str, str, list[Call]]], *, with_ids: bool, t0: int = T0
) -> None:
    """Ingest through the collector path (flatten + durable write), 32 rollouts per request, plus rewards."""
    rng = np.random.default_rng(1)
    for start in track(range(0, len(rollouts), 32), description="ingesting", transient=True):
        ingest_traces(store, traces_request(rollouts[start : start + 32], with_ids=with_ids, t0=t0))
    for rollout_id, _, _ in rollouts:
        reward = RewardIn(rollout_id=rollout_id, value=float(rng.integers(0, 2)), source="grader")
        ingest_logs(store, reward_log_request(reward, now_ns=t0 + 10**10))


def copy_rows(series: pl.Series, width: int, fill: float, *, left: bool, dtype: type) -> np.ndarray:
    """A list column copied into a padded array with one slice assignment per row."""
    values, offsets = flat_lists(series)
    out = np.full((len(offsets) - 1, width), fill, dtype=dtype)
    for row, (start, end) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)):
        if left:
            out[row, width - (end - start) :] = values[start:end]
        else:
            out[row, : end - start] = values[start:end]
    return out


def numpy_limit(columns: list[tuple[pl.Series, bool, type]], repeats: int = 5) -> float:
    """CPU seconds NumPy needs just to copy list columns into padded arrays (left- or right-aligned).

    The faster of two copies: one masked assignment per column (`export.pad`), or one slice assignment per
    row (faster for few long rows, as here); the limit is what NumPy can do, not what the pipeline does.
    """
    best = float("inf")
    for copy in (pad, copy_rows):
        for _ in range(repeats):
            start = time.process_time()
            for series, left, dtype in columns:
                copy(series, int(series.list.len().max()), 0, left=left, dtype=dtype)
            best = min(best, time.process_time() - start)
    return best


def timed_exact(db: Path, repeats: int) -> dict[str, float]:
    """Best-of-`repeats` seconds for read (views -> Arrow -> polars), build (merge...) and pad (DataProto)."""
    con = duckdb.connect(str(db), read_only=True, config={"threads": "1"})

    def run(sql: str, params: Params | None = None) -> pl.DataFrame:
        return pl.from_arrow(con.execute(sql, params).to_arrow_table())

    options = SampleOptions(drift_sample=0)
    from verl.trainer.ppo import core_algos  # noqa: F401 - imported once, not timed

    best: dict[str, float] = {}
    for _ in range(repeats):
        t0 = time.process_time()
        calls, rollouts, rewards = load_inputs("true", run)
        t1 = time.process_time()
        samples, report = build_samples(calls, rollouts, rewards, options=options)
        t2 = time.process_time()
        batch = to_dataproto(samples, pad_token_id=PAD_ID)
        t3 = time.process_time()
        for step, seconds in (("read", t1 - t0), ("build", t2 - t1), ("pad", t3 - t2), ("total", t3 - t0)):
            best[step] = min(best.get(step, float("inf")), seconds)
    # planning the views' reads alone: the same statements with LIMIT 0 (DuckDB binds and optimizes the whole
    # view tree, then reads no row)
    statements: list[str] = []

    def run_and_keep(sql: str) -> pl.DataFrame:
        statements.append(sql)
        return run(sql)

    load_inputs("true", run_and_keep)
    for _ in range(repeats):
        start = time.process_time()
        for sql in statements:
            con.sql(f"SELECT * FROM ({sql}) LIMIT 0").to_arrow_table()
        best["plan"] = min(best.get("plan", float("inf")), time.process_time() - start)
    raw = "SELECT prompt_token_ids, choice_token_ids, choice_logprobs FROM call_tokens"
    for _ in range(repeats):
        start = time.process_time()
        con.sql(raw).to_arrow_table()
        best["raw_read"] = min(best.get("raw_read", float("inf")), time.process_time() - start)
    con.close()
    # the limit: copying the samples' tokens (ids, mask, logprobs) into the padded arrays a trainer takes
    best["limit"] = numpy_limit(
        [
            (samples["prompt_ids"], True, np.int64),
            *((samples[c], False, d) for c, d in RESPONSE_DTYPES.items()),
        ]
    )
    # a looser one: copying every call's tokens as stored (each prompt and answer) into padded arrays
    answers = calls["completion_token_ids"].list.first()
    best["limit_calls"] = numpy_limit(
        [(calls["prompt_token_ids"], True, np.int64), (answers, False, np.int64)]
    )
    best["sample_tokens"] = report.prompt_tokens + report.response_tokens
    best["read_tokens"] = float(calls.select(pl.col("prompt_token_ids").list.len().sum()).item()) + float(
        calls.select(
            pl.col("completion_token_ids").list.eval(pl.element().list.len()).list.sum().sum()
        ).item()
    )
    best["samples"] = samples.height
    best["padded_shape"] = tuple(batch.batch["input_ids"].shape)  # type: ignore[assignment]
    return best


def timed_retokenized(db: Path, tokenizer) -> dict[str, float]:
    """The retokenizing path (no ids recorded) against the tokenizer's batch-encode of the same texts."""
    from otel_rl.transforms.tokens import render_call

    con = duckdb.connect(str(db), read_only=True, config={"threads": "1"})

    def run(sql: str, params: Params | None = None) -> pl.DataFrame:
        return pl.from_arrow(con.execute(sql, params).to_arrow_table())

    calls, rollouts, rewards = load_inputs("true", run, messages=True)
    start = time.process_time()
    samples, report = build_samples(
        calls, rollouts, rewards, tokenizer=tokenizer, options=SampleOptions(drift_sample=0)
    )
    seconds = time.process_time() - start
    texts = []
    for row in calls.select("input_messages", "output_messages", "tool_definitions").iter_rows():
        prompt, completions = render_call(tokenizer, *row)
        texts += [prompt, *completions]
    start = time.process_time()
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    encode_seconds = time.process_time() - start
    con.close()
    return {
        "seconds": seconds,
        "sample_tokens": report.prompt_tokens + report.response_tokens,
        "encoded_tokens": sum(len(ids) for ids in encoded),
        "encode_seconds": encode_seconds,
        "segments": samples.height,
        "token_sources": report.token_sources,  # type: ignore[dict-item]
    }


def timed_step_read(db: Path, groups: list[str], repeats: int) -> dict[str, float]:
    """An online step's read of 8 groups (read_groups, the statements the trainer sends the server), through a
    read-only connection of the store (one DuckDB thread), best-of-`repeats` CPU s; the rows it read."""
    con = connect(db, read_only=True)

    def run(sql: str, params: Params | None = None) -> pl.DataFrame:
        return pl.from_arrow(con.execute(sql, params).to_arrow_table())

    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        calls, rollouts, rewards = read_groups(run, groups)
        best = min(best, time.process_time() - start)
    ((spans,),) = con.execute("SELECT count(*) FROM spans").fetchall()
    con.close()
    return {
        "seconds": best,
        "calls": calls.height,
        "rollouts": rollouts.height,
        "rewards": rewards.height,
        "spans": spans,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=512)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--retok-rollouts", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--history", type=int, default=3, help="older copies of the rollouts under an online step's reads"
    )
    args = parser.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as the targets say
    console = Console(width=None if sys.stdout.isatty() else 150)
    rng = np.random.default_rng(0)
    rollouts = [(f"r{i:05d}", f"g{i // 8:04d}", rollout_calls(rng, args.turns)) for i in range(args.rollouts)]

    with tempfile.TemporaryDirectory() as tmp:
        exact_db, retok_db = Path(tmp) / "exact.duckdb", Path(tmp) / "retok.duckdb"
        start = time.process_time()
        with Store(exact_db) as store:
            fill_store(store, rollouts, with_ids=True)
        console.print(
            f"ingested {args.rollouts} x {args.turns} calls: {time.process_time() - start:.1f} CPU s"
        )
        with Store(retok_db) as store:
            fill_store(store, rollouts[: args.retok_rollouts], with_ids=False)
        exact = timed_exact(exact_db, args.repeats)

        from otel_rl.tinymodel import build_tokenizer

        retok = timed_retokenized(retok_db, build_tokenizer())

        # An online run: the rollouts as steps of 8 groups, an hour apart, after `history` older copies of
        # them (oldest first, as a store fills); the last step's read. The floor: the same read over a store
        # holding only that step's rollouts.
        steps_db, step_only_db = Path(tmp) / "steps.duckdb", Path(tmp) / "step-only.duckdb"
        step_size = 64
        with Store(steps_db) as store:
            for copy in range(args.history, -1, -1):
                for first in range(0, len(rollouts), step_size):
                    age = (copy * len(rollouts) + len(rollouts) - first) // step_size - 1  # in steps
                    step = rollouts[first : first + step_size]
                    chunk = [(f"h{copy}-{r}", f"h{copy}-{g}", c) for r, g, c in step]
                    fill_store(store, chunk, with_ids=True, t0=T0 - age * HOUR_NS)
        with Store(step_only_db) as store:
            fill_store(store, chunk, with_ids=True, t0=T0)
        last_step = sorted({group for _, group, _ in chunk})
        steps = timed_step_read(steps_db, last_step, args.repeats)
        step_only = timed_step_read(step_only_db, last_step, args.repeats)

    load = "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())  # CPU s of one core: less moved by others
    table = Table(
        title=f"store -> padded arrays, {args.rollouts} rollouts x {args.turns} turns, one core ({load})"
    )
    for column in ("path", "seconds", "tokens/s", "samples/s", "vs limit"):
        table.add_column(column, justify="left" if column == "path" else "right")
    tokens, n, limit = exact["sample_tokens"], exact["samples"], exact["limit"]

    def row(name: str, seconds: float, n_tokens: float, n_samples: float | None, vs: float | None) -> None:
        table.add_row(
            name,
            f"{seconds:.3f}",
            f"{n_tokens / seconds / 1e6:.2f}M",
            f"{n_samples / seconds:.0f}" if n_samples else "",
            f"{vs:.1%}" if vs is not None else "",
        )

    # each step alone against the limit too: what bounds the total
    row("read through the views", exact["read"], tokens, None, limit / exact["read"])
    row("  (planning its statements alone)", exact["plan"], tokens, None, limit / exact["plan"])
    row("  (raw call_tokens table, no views)", exact["raw_read"], tokens, None, limit / exact["raw_read"])
    row("build samples", exact["build"], tokens, None, limit / exact["build"])
    row("pad into a DataProto", exact["pad"], tokens, None, limit / exact["pad"])
    row("exact ids: store -> padded, total", exact["total"], tokens, n, limit / exact["total"])
    row(
        "  without the views' read",
        exact["build"] + exact["pad"],
        tokens,
        n,
        limit / (exact["build"] + exact["pad"]),
    )
    row("limit: NumPy copy of the samples' tokens", limit, tokens, n, 1.0)
    read_tokens, limit_calls = exact["read_tokens"], exact["limit_calls"]
    row("exact ids, per token read", exact["total"], read_tokens, None, limit_calls / exact["total"])
    row(
        "  without the views' read",
        exact["build"] + exact["pad"],
        read_tokens,
        None,
        limit_calls / (exact["build"] + exact["pad"]),
    )
    row("limit: NumPy copy of every call's tokens", limit_calls, read_tokens, None, 1.0)
    retok_vs = retok["encode_seconds"] / retok["seconds"]
    row("retokenized: build samples", retok["seconds"], retok["encoded_tokens"], retok["segments"], retok_vs)
    row(
        "limit: tokenizer batch encode, same texts",
        retok["encode_seconds"],
        retok["encoded_tokens"],
        None,
        1.0,
    )
    console.print(table)
    console.print(
        f"{int(tokens):,} sample tokens in {int(n)} samples, padded {exact['padded_shape']}; "
        f"{int(exact['read_tokens']):,} tokens read (every call's prompt and answer). Retokenized run: "
        f"{args.retok_rollouts} rollouts, calls {retok['token_sources']} (its tokens/s: tokens encoded)."
    )
    console.print(
        f"online step read (read_groups: {steps['rollouts']} rollouts, {steps['calls']} calls,"
        f" {steps['rewards']} rewards) with {args.history} older copies of the rollouts stored"
        f" ({steps['spans']:,} spans): {steps['seconds']:.3f} CPU s; floor, the same read over a store of"
        f" only the step's rollouts ({step_only['spans']:,} spans): {step_only['seconds']:.3f} CPU s"
        f" ({steps['seconds'] / step_only['seconds']:.2f}x)"
    )
    for aim, met in (
        (">= 2M tokens/s", tokens / exact["total"] >= 2e6),
        (">= 25% of the limit", limit / exact["total"] >= 0.25),
    ):
        console.print(f"aim (store -> padded, total) {aim}: {'met' if met else 'missed'}")


if __name__ == "__main__":
    main()
