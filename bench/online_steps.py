"""A long online run without a model: per-step transform time over 200 steps, against the floor.

Each step, synthetic rollouts go through a real `otel-rl serve` and its store as an online run's do: the
gateway's call spans (exact token ids) of the groups in flight arrive turn by turn, then each finished
rollout's controller status span and its grader reward. The trainer's side then runs what a step runs:
it waits for the status spans (store/reads.py attempt_progress, as await_in_store does), and turns the
groups into samples (train/batches.py group_samples: read_groups over the normalized tables, then
build_samples). The floor is build_samples alone over the same frames, already in memory. The groups of the
next step are in flight meanwhile (half their turns sent), as the launcher keeps them.

Prints the transform's seconds at steps 1, 50, 100, 200 (the median of the 5 steps around each), its slope
over the run, the floor, and the server's normalizing rounds. The aim (issue 27): step 200 <= 1.5x step 1.
Each step's record has the rounds the server ran since the last step (rounds, raw rows read, traces in their
scopes, seconds) and the CPU seconds the server spent in the transform's wait and read: on a machine other
processes load, wall time stretches with the load, CPU time much less, so the two together tell a cost that
grows with the run from a busier machine.

Run: .venv/bin/python bench/online_steps.py [--steps 200] [--groups 4] [--group-size 4] [--turns 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx
import numpy as np
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from otel_rl_server import ServerProcess  # noqa: E402 - the tests' real-server helper

from otel_rl import attributes as attr  # noqa: E402
from otel_rl.collector.rewards import RewardIn, reward_log_request  # noqa: E402
from otel_rl.query import QueryError  # noqa: E402
from otel_rl.store import reads  # noqa: E402
from otel_rl.train.groups import read_groups  # noqa: E402
from otel_rl.train.server_client import ServerClient  # noqa: E402
from otel_rl.transforms.samples import SampleOptions, build_samples  # noqa: E402

MARKS = (1, 50, 100, 200)
AROUND = 2  # steps either side of a mark in its median
AIM = 1.5  # step 200's transform over step 1's


class Rollout:
    """One synthetic rollout: its identity, trace, and the exact tokens of each turn."""

    def __init__(self, rng: np.random.Generator, group: str, index: int, turns: int) -> None:
        self.id = f"{group}-r{index}"
        self.identity = {
            attr.ROLLOUT_ID: self.id,
            attr.ATTEMPT_ID: f"{self.id}-a0",
            attr.GROUP_ID: group,
            attr.TASK_ID: f"task-{group}",
            attr.SPLIT: "train",
        }
        self.trace_id, self.root_id = os.urandom(16), os.urandom(8)
        self.start_ns = time.time_ns()
        self.turns = []  # (prompt, completion): each prompt extends the last (one merged sample)
        context = rng.integers(10, 30000, 64, dtype=np.int32)
        for _ in range(turns):
            completion = rng.integers(10, 30000, 16, dtype=np.int32)
            self.turns.append((context, completion))
            context = np.concatenate([context, completion, rng.integers(10, 30000, 8, dtype=np.int32)])
        self.reward = float(rng.integers(0, 2))


def _kv(key: str, value: str | int | bytes) -> KeyValue:
    if isinstance(value, bytes):
        return KeyValue(key=key, value=AnyValue(bytes_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def calls_request(rollouts: list[Rollout], turn: int, version: int) -> ExportTraceServiceRequest:
    """The gateway's call span of turn `turn` of each rollout (exact ids and logprobs), as one export."""
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    scope.scope.name = attr.GATEWAY_SCOPE
    now = time.time_ns()
    for rollout in rollouts:
        prompt, completion = rollout.turns[turn]
        attributes = [_kv(k, v) for k, v in rollout.identity.items()]
        attributes += [
            _kv("gen_ai.operation.name", "chat"),
            _kv("gen_ai.request.model", "tiny"),
            _kv(attr.POLICY_VERSION, version),
            _kv(attr.PROMPT_TOKEN_IDS, prompt.astype("<i4").tobytes()),
            _kv(attr.CHOICE_TOKEN_IDS.format(i=0), completion.astype("<i4").tobytes()),
            _kv(attr.CHOICE_LOGPROBS.format(i=0), np.full(completion.size, -0.5, "<f4").tobytes()),
        ]
        scope.spans.append(
            Span(
                trace_id=rollout.trace_id,
                span_id=os.urandom(8),
                parent_span_id=rollout.root_id,
                name="chat tiny",
                kind=Span.SPAN_KIND_CLIENT,
                start_time_unix_nano=now - 1_000_000,
                end_time_unix_nano=now,
                attributes=attributes,
            )
        )
    return request


def status_request(rollouts: list[Rollout]) -> ExportTraceServiceRequest:
    """The controller's rollout span of each finished rollout (exported when its harness exits)."""
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    scope.scope.name = attr.CONTROLLER_SCOPE
    for rollout in rollouts:
        attributes = [_kv(k, v) for k, v in rollout.identity.items()] + [_kv(attr.ROLLOUT_STATUS, "ok")]
        scope.spans.append(
            Span(
                trace_id=rollout.trace_id,
                span_id=rollout.root_id,
                name=attr.ROLLOUT_SPAN_NAME,
                kind=Span.SPAN_KIND_INTERNAL,
                start_time_unix_nano=rollout.start_ns,
                end_time_unix_nano=time.time_ns(),
                attributes=attributes,
            )
        )
    return request


class Traffic:
    """What the harnesses, the gateway and the controller send, over OTLP/HTTP with the admin token."""

    def __init__(self, server: ServerProcess) -> None:
        headers = {"Content-Type": "application/x-protobuf", **server.auth}
        self._http = httpx.Client(base_url=server.http_url, headers=headers, timeout=60)

    def send(self, path: str, request: object) -> None:
        response = self._http.post(path, content=request.SerializeToString())
        response.raise_for_status()

    def turns(self, rollouts: list[Rollout], turns: range, version: int) -> None:
        for turn in turns:
            self.send("/v1/traces", calls_request(rollouts, turn, version))

    def finish(self, rollouts: list[Rollout]) -> None:
        # the grader's reward first, then the status span: a controller posts its grade before it ends the
        # attempt's span (controller/coding.py), and a step waits for the commit of that span
        for rollout in rollouts:
            reward = RewardIn(rollout_id=rollout.id, value=rollout.reward, source="grader")
            self.send("/v1/logs", reward_log_request(reward, now_ns=time.time_ns()))
        self.send("/v1/traces", status_request(rollouts))


def step_groups(rng: np.random.Generator, step: int, args: argparse.Namespace) -> list[Rollout]:
    return [
        Rollout(rng, f"s{step}-g{g}", i, args.turns)
        for g in range(args.groups)
        for i in range(args.group_size)
    ]


def process_cpu(pid: int) -> float:
    """The CPU seconds (user and system, every thread) process `pid` has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15


def wait_for_rounds(client: ServerClient, seen: int) -> None:
    """Wait as group_samples does until the normalized tables include commit `seen`; on a machine loaded
    enough that a round outlasts the server's query limit (503), wait again: the wait is what is measured."""
    while True:
        try:
            client.query("SELECT 1 FROM llm_calls LIMIT 0", after_commit=seen)
            return
        except QueryError as exc:
            if " 503: " not in str(exc):
                raise
            print(f"waited past the server's query limit, waiting again: {exc}", file=sys.stderr)


def timed_step(
    client: ServerClient,
    rollouts: list[Rollout],
    version: int,
    server_cpu: Callable[[], float],
    *,
    warm_up: bool = False,
) -> dict[str, float]:
    """The trainer's part of one step: wait for the status spans, read the groups, build samples."""
    options = SampleOptions(current_policy_version=version)
    groups = sorted({r.identity[attr.GROUP_ID] for r in rollouts})
    attempts = sorted(r.identity[attr.ATTEMPT_ID] for r in rollouts)
    since = min(r.start_ns for r in rollouts) - 5 * 10**9
    started = time.perf_counter()
    # as await_in_store polls: the step waits for its attempts' newest span, not for the newest commit
    seen = int(reads.attempt_progress(client.query, attempts, since)["commit_seq"].max())
    cpu_polled = server_cpu()
    polled = time.perf_counter()
    wait_for_rounds(client, seen)
    waited = time.perf_counter()
    cpu_waited = server_cpu()
    calls, found, rewards = read_groups(
        lambda sql, params: client.query(sql, params, after_commit=seen), groups, since
    )
    read = time.perf_counter()
    cpu_read = server_cpu()
    if warm_up:  # the first build imports the advantage estimators (seconds): no step's cost
        build_samples(calls, found, rewards, options=options)
    built = time.perf_counter()
    samples, report = build_samples(calls, found, rewards, options=options)
    floor = time.perf_counter()
    build_samples(calls, found, rewards, options=options)
    ended = time.perf_counter()
    if report.rollouts_used != len(rollouts) or samples.height != len(rollouts):
        raise SystemExit(
            f"{len(rollouts)} rollouts gave {samples.height} samples of {report.rollouts_used} rollouts:"
            " the synthetic traffic broke"
        )
    return {
        "status": polled - started,
        "wait": waited - polled,
        "read": read - waited,
        "build": floor - built,
        "transform": read - polled + floor - built,
        "floor": ended - floor,
        "cpu_wait": cpu_waited - cpu_polled,
        "cpu_read": cpu_read - cpu_waited,
        "cpu": cpu_read - cpu_polled,
    }


def normalizer_figures(server: ServerProcess) -> dict[str, float]:
    """The server's normalizing rounds so far (from /metrics)."""
    text = httpx.get(f"{server.http_url}/metrics", headers=server.auth, timeout=30).text
    figures = {}
    for line in text.splitlines():
        if line.startswith(("otel_rl_store_normalize_round_duration_seconds_", "otel_rl_store_normalized_")):
            name, value = line.rsplit(" ", 1)
            if "{" not in name or name.endswith('le="+Inf"}'):
                figures[name.split("{")[0]] = float(value)
    return figures


def step_rounds(now: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """The server's normalizing rounds between two readings of normalizer_figures: how many, the raw rows
    they read, the traces in their scopes, their seconds."""
    names = {
        "rounds": "otel_rl_store_normalize_round_duration_seconds_count",
        "round_rows": "otel_rl_store_normalized_rows_total",
        "round_traces": "otel_rl_store_normalized_scope_traces_total",
        "round_s": "otel_rl_store_normalize_round_duration_seconds_sum",
    }
    return {key: now.get(name, 0.0) - before.get(name, 0.0) for key, name in names.items()}


def around(values: list[float], step: int) -> float:
    """The median of the steps around `step` (1-based), clipped to the run."""
    low, high = max(0, step - 1 - AROUND), min(len(values), step + AROUND)
    return statistics.median(values[low:high])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--groups", type=int, default=4, help="groups per step")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4, help="model calls per rollout")
    args = parser.parse_args()
    if not 1 <= args.steps <= 10_000 or not 1 <= args.groups * args.group_size * args.turns <= 100_000:
        parser.error("--steps must be 1-10000, and groups x group-size x turns 1-100000")
    rng = np.random.default_rng(0)
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as workdir:
        server = ServerProcess(Path(workdir) / "store.duckdb", Path(workdir)).start()
        client = ServerClient(server.http_url, server.token)
        traffic = Traffic(server)
        assert server.process is not None
        pid = server.process.pid
        try:
            figures = normalizer_figures(server)
            half = args.turns // 2
            current = step_groups(rng, 1, args)
            traffic.turns(current, range(half), 0)
            for step in range(1, args.steps + 1):
                upcoming = step_groups(rng, step + 1, args)
                traffic.turns(upcoming, range(half), step - 1)  # the next step's groups start meanwhile
                traffic.turns(current, range(half, args.turns), step - 1)
                traffic.finish(current)
                rows.append(
                    timed_step(client, current, step - 1, partial(process_cpu, pid), warm_up=step == 1)
                )
                figures, before = normalizer_figures(server), figures
                rows[-1] |= step_rounds(figures, before)
                if step in MARKS or step % 25 == 0:
                    r = rows[-1]
                    print(
                        f"step {step:>4}: transform {r['transform']:.3f} s (wait {r['wait']:.3f}, read"
                        f" {r['read']:.3f}, build {r['build']:.3f}; server CPU {r['cpu']:.2f} s), status wait"
                        f" {r['status']:.3f} s, floor {r['floor']:.3f} s; rounds {r['rounds']:.0f}: rows"
                        f" {r['round_rows']:.0f}, scope {r['round_traces']:.0f} traces, {r['round_s']:.3f} s",
                        flush=True,
                    )
                current = upcoming
            rounds = figures
            health = httpx.get(f"{server.http_url}/healthz", headers=server.auth, timeout=30).json()
        except Exception:
            print(f"the server's log ends:\n{server.log()[-4000:]}", file=sys.stderr)
            raise
        finally:
            client.close()
            server.stop()
    report(rows, rounds, args)
    print(f"normalized tables at the end: {health.get('normalized')}")


# The per-step record's columns in the table: (key, header, width, decimals).
COLUMNS = (
    ("transform", "transform s", 12, 3),
    ("wait", "wait s", 8, 3),
    ("read", "read s", 8, 3),
    ("build", "build s", 8, 3),
    ("status", "status s", 9, 3),
    ("floor", "floor s", 8, 3),
    ("cpu", "server CPU s", 13, 2),
    ("round_rows", "round rows", 11, 0),
    ("round_traces", "scope traces", 13, 0),
    ("round_s", "round s", 8, 3),
)


def slope_and_ratio(values: list[float]) -> tuple[float, float]:
    """The least-squares slope per step, and the last mark's median over the first's."""
    slope = np.polyfit(np.arange(1, len(values) + 1), values, 1)[0] if len(values) > 1 else 0.0
    first = around(values, 1)
    return float(slope), around(values, len(values)) / first if first else float("nan")


def report(rows: list[dict[str, float]], rounds: dict[str, float], args: argparse.Namespace) -> None:
    print(
        f"\n{len(rows)} steps of {args.groups} groups x {args.group_size} rollouts x {args.turns} calls"
        f" (median of the {2 * AROUND + 1} steps around each mark; rounds: those since the step before)"
    )
    print(f"{'step':>6} " + " ".join(f"{header:>{width}}" for _, header, width, _ in COLUMNS))
    for mark in (m for m in MARKS if m <= len(rows)):
        figures = (around([r[key] for r in rows], mark) for key, *_ in COLUMNS)
        columns = (
            f"{v:>{width}.{places}f}" for v, (_, _, width, places) in zip(figures, COLUMNS, strict=True)
        )
        print(f"{mark:>6} " + " ".join(columns))
    for key, what in (("transform", "transform"), ("cpu", "server CPU in the transform")):
        slope, ratio = slope_and_ratio([r[key] for r in rows])
        print(f"{what}: slope {slope * 1000:+.2f} ms per step; last/first: {ratio:.2f}x (aim <= {AIM}x)")
    print(
        f"floor: {around([r['floor'] for r in rows], len(rows)):.3f} s (build_samples over in-memory frames)"
    )
    count = rounds.get("otel_rl_store_normalize_round_duration_seconds_count", 0)
    total = rounds.get("otel_rl_store_normalize_round_duration_seconds_sum", 0)
    print(
        f"normalizing: {count:.0f} rounds, {total:.1f} s in all, "
        f"{rounds.get('otel_rl_store_normalized_rows_total', 0):.0f} raw rows read"
    )


if __name__ == "__main__":
    main()
