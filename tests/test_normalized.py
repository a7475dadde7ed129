"""The normalized tables, maintained as data arrives, equal the views computed from scratch over the same raw
rows: for every capture in tests/ (libraries, frameworks, coding CLIs) plus rollouts with gateway calls,
client calls they supersede and rewards, arriving in random orders, split into random requests, committed in
random groups and normalized in random rounds. Late data (a parent after its children, a log record or a
reward after its spans) happens in every order."""

import random
import re
import shutil
import threading
import time
from concurrent.futures import wait
from pathlib import Path

import duckdb
import httpx
import pytest
from dated_traffic import gauge_request
from from_scratch import differences
from gateway_server import GatewayServer
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otel_fixtures import CLI_CAPTURES, captured_requests, framework_captures, requests_under
from prometheus_client.parser import text_string_to_metric_families
from rollout_traffic import rollout_requests

from otel_rl.collector.ingest import logs_batch, metrics_batch, traces_batch
from otel_rl.store import Store, normalize
from otel_rl.store.definitions import NORMALIZED
from otel_rl.store.normalizer import NotNormalized
from otel_rl.store.schema import default_transforms_dir


def every_capture() -> list[Message]:
    requests = [r.decoded for r in captured_requests()]
    for scenario in framework_captures():
        requests += [r.decoded for r in scenario.requests]
    requests += [r.decoded for r in requests_under(CLI_CAPTURES, CLI_CAPTURES)]
    start = time.time_ns()
    for i in range(6):
        requests += rollout_requests(f"r-{i}", start + i * 10**9, with_client=i % 2 == 0)
    return [r for r in requests if isinstance(r, ExportTraceServiceRequest | ExportLogsServiceRequest)]


def split(request: Message, rng: random.Random) -> list[Message]:
    """The request's records in 1-3 requests (each record keeps its resource and scope)."""
    pieces = [type(request)() for _ in range(rng.randint(1, 3))]
    spans = isinstance(request, ExportTraceServiceRequest)
    for outer in request.resource_spans if spans else request.resource_logs:
        for scoped in outer.scope_spans if spans else outer.scope_logs:
            for record in scoped.spans if spans else scoped.log_records:
                piece = rng.choice(pieces)
                new_outer = (piece.resource_spans if spans else piece.resource_logs).add()
                new_outer.resource.CopyFrom(outer.resource)
                new_scoped = (new_outer.scope_spans if spans else new_outer.scope_logs).add()
                new_scoped.scope.CopyFrom(scoped.scope)
                (new_scoped.spans if spans else new_scoped.log_records).add().CopyFrom(record)
    return [piece for piece in pieces if piece.ByteSize()]


def ingest_shuffled(store: Store, requests: list[Message], rng: random.Random) -> None:
    """Every record of `requests` (each sent twice, as a retrying exporter may), in a random order and
    grouping, with the normalizer catching up at random points."""
    pieces = [piece for request in requests for piece in split(request, rng)]
    pieces += rng.sample(pieces, len(pieces) // 10)  # retried exports: stored once
    rng.shuffle(pieces)
    while pieces:
        size = rng.randint(1, 12)
        group, pieces = pieces[:size], pieces[size:]
        batches = [
            traces_batch(p, "admin")
            if isinstance(p, ExportTraceServiceRequest)
            else logs_batch(store, p, "admin")
            for p in group
        ]
        wait([store.submit(batch) for batch in batches])
        if rng.random() < 0.3:
            store.wait_normalized()


@pytest.mark.parametrize("seed", range(4))
def test_the_normalized_tables_equal_the_views_from_scratch_in_any_arrival_order(
    tmp_path: Path, seed
) -> None:
    rng = random.Random(seed)
    db = tmp_path / "store.duckdb"
    with Store(db) as store:
        ingest_shuffled(store, every_capture(), rng)
        store.wait_normalized()
        counts = {
            name: store.query_arrow(f"SELECT count(*) AS n FROM {name}")["n"][0].as_py()
            for name in NORMALIZED
        }
        rounds = store.normalizer.rounds
    assert all(counts.values()), counts  # every table holds rows: the comparison below compares something
    assert rounds > 3, rounds
    assert differences(db) == {name: (0, 0) for name in NORMALIZED}


def test_a_commit_the_views_cannot_normalize_is_skipped_and_kept_raw_and_the_rest_goes_on(tmp_path) -> None:
    transforms = tmp_path / "transforms"
    shutil.copytree(default_transforms_dir(), transforms)
    identity = transforms / "15_identity.sql"
    poisoned = "WHERE CASE WHEN p.rollout_id = 'poison' THEN error('a poisoned rollout') ELSE true END;"
    identity.write_text(identity.read_text().rstrip().removesuffix(";") + f"\n{poisoned}\n")
    start = time.time_ns()
    with Store(tmp_path / "store.duckdb", transforms_dir=transforms) as store:
        for rollout_id in ("r-0", "poison", "r-1"):
            spans, reward = rollout_requests(rollout_id, start)
            wait(
                [store.submit(traces_batch(spans, "admin")), store.submit(logs_batch(store, reward, "admin"))]
            )
        store.wait_normalized(timeout_s=60)
        rollouts = store.query_arrow("SELECT rollout_id FROM rollouts ORDER BY 1")["rollout_id"].to_pylist()
        raw = store.query_arrow(
            "SELECT count(*) AS n FROM spans WHERE attributes ->> 'otel_rl.rollout.id' = 'poison'"
        )["n"][0].as_py()
        skipped = store.query_arrow("SELECT commit_seq, error FROM normalized.skipped").to_pylist()

    assert rollouts == ["r-0", "r-1"] and raw == 3  # the poisoned rollout's spans are kept, raw
    assert len(skipped) == 1 and "a poisoned rollout" in skipped[0]["error"]


def test_a_round_interrupted_after_its_commit_is_not_normalized_twice(tmp_path, monkeypatch) -> None:
    # A reader preempts the background round (wait_for): its interrupt may land after the round committed,
    # before the thread heard of it. The next round must go on from the stored watermark, not redo the round
    # (which read the round's rows twice: a rollout's reward twice in `rewards`, seen once in CI).
    real_round, interrupted = normalize.run_round, []

    def committed_then_interrupted(*args, **kwargs):
        done = real_round(*args, **kwargs)
        if not interrupted:
            interrupted.append(done.through)
            raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")
        return done

    monkeypatch.setattr(normalize, "run_round", committed_then_interrupted)
    db = tmp_path / "store.duckdb"
    with Store(db) as store:
        spans, reward = rollout_requests("r-0", time.time_ns())
        wait([store.submit(traces_batch(spans, "admin")), store.submit(logs_batch(store, reward, "admin"))])
        store.wait_normalized(timeout_s=60)
        rewards = store.query_arrow("SELECT rollout_id FROM rewards")["rollout_id"].to_pylist()
    assert interrupted and rewards == ["r-0"]
    assert differences(db) == {name: (0, 0) for name in NORMALIZED}


def test_a_read_after_a_commit_waits_for_that_commit_only(tmp_path) -> None:
    start = time.time_ns()
    with Store(tmp_path / "store.duckdb") as store:
        spans, reward = rollout_requests("r-0", start)
        wait([store.submit(traces_batch(spans, "admin")), store.submit(logs_batch(store, reward, "admin"))])
        seen = store.seen_through()
        store.wait_normalized()
        with store.normalizer.paused():  # no round runs: later commits stay behind
            later, _ = rollout_requests("r-1", start)
            store.submit(traces_batch(later, "admin")).result()
            assert store.normalizer.lag == 1
            read = store.user_query("SELECT rollout_id FROM rollouts", timeout_s=5, after_commit=seen).run()
            with pytest.raises(NotNormalized, match=r"1 commits \([\d.]+ s\) behind"):
                store.user_query("SELECT rollout_id FROM rollouts", timeout_s=0.5).run()
            with pytest.raises(ValueError, match="the store's last commit is"):
                store.user_query("SELECT 1", after_commit=store.seen_through() + 1)
        store.wait_normalized()
        both = store.query_arrow("SELECT rollout_id FROM rollouts ORDER BY 1")["rollout_id"].to_pylist()

    assert read["rollout_id"].to_pylist() == ["r-0"] and both == ["r-0", "r-1"]


def test_a_commit_that_names_nothing_moves_the_watermark_and_keeps_every_normalized_row(tmp_path) -> None:
    start = time.time_ns()
    with Store(tmp_path / "store.duckdb") as store:
        spans, reward = rollout_requests("r-0", start)
        wait([store.submit(traces_batch(spans, "admin")), store.submit(logs_batch(store, reward, "admin"))])
        store.wait_normalized()
        before = {name: store.query_arrow(f"SELECT * FROM {name}").num_rows for name in NORMALIZED}
        store.submit(metrics_batch(gauge_request("queue.depth", 3.0), "admin")).result()  # no span, no log
        store.wait_normalized()
        empty_round = store.normalizer.last_round
        after = {name: store.query_arrow(f"SELECT * FROM {name}").num_rows for name in NORMALIZED}
        later, _ = rollout_requests("r-1", start)  # and rounds go on from the watermark it moved
        store.submit(traces_batch(later, "admin")).result()
        store.wait_normalized()
        rollouts = store.query_arrow("SELECT rollout_id FROM rollouts ORDER BY 1")["rollout_id"].to_pylist()
        through, committed = store.normalizer.through, store.seen_through()

    assert empty_round.rows == 0 and empty_round.commits == 1
    assert after == before and before["rollout_rows"] == 1 and before["rewards"] >= 1
    assert rollouts == ["r-0", "r-1"] and through == committed


def test_a_read_during_a_backlog_waits_within_its_time_limit_for_the_commit_it_needs(tmp_path) -> None:
    with Store(tmp_path / "store.duckdb") as store:
        spans, reward = rollout_requests("r-0", time.time_ns())
        pause = store.normalizer.paused()
        with pause:  # a backlog: no round runs until the pause ends
            wait(
                [store.submit(traces_batch(spans, "admin")), store.submit(logs_batch(store, reward, "admin"))]
            )
            assert store.normalizer.lag >= 1 and store.normalizer.behind_since is not None
            threading.Timer(0.5, pause.release).start()
            started = time.monotonic()
            read = store.user_query("SELECT rollout_id FROM rollouts", timeout_s=60).run()
            waited = time.monotonic() - started
            pause.acquire()  # released by the timer: held again for the block's exit
        assert read["rollout_id"].to_pylist() == ["r-0"] and waited >= 0.5
        assert store.normalizer.lag == 0 and store.normalizer.lag_seconds == 0


def normalizer_metrics(server: GatewayServer) -> dict[str, float]:
    text = httpx.get(f"{server.base_url}/metrics", headers=server.admin, timeout=10).text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("otel_rl_store_normalize_lag_")
    }


def test_past_its_time_limit_a_query_says_how_far_behind_the_tables_are_and_since_when(tmp_path) -> None:
    db = tmp_path / "store.duckdb"
    with GatewayServer(db, vllm=["http://127.0.0.1:9"], query_timeout_s=1.0) as server:
        spans, reward = rollout_requests("r-0", time.time_ns())
        otlp = {**server.admin, "Content-Type": "application/x-protobuf"}
        sent = httpx.post(f"{server.base_url}/v1/traces", content=spans.SerializeToString(), headers=otlp)
        assert sent.status_code == 200, sent.text
        server.store.wait_normalized(timeout_s=60)
        assert normalizer_metrics(server) == {
            "otel_rl_store_normalize_lag_commits": 0,
            "otel_rl_store_normalize_lag_seconds": 0,
        }
        with server.store.normalizer.paused():  # a backlog: the reward's commit waits
            before = time.time()
            sent = httpx.post(f"{server.base_url}/v1/logs", content=reward.SerializeToString(), headers=otlp)
            assert sent.status_code == 200, sent.text
            # The backlog's age in seconds is what is measured: nothing to wait on but the clock.
            time.sleep(1.5)
            lag = normalizer_metrics(server)
            health = httpx.get(f"{server.base_url}/healthz", headers=server.admin, timeout=10).json()
            read = time.time()  # the commit was made after `before`: its age when read is below read - before
            answer = httpx.post(
                f"{server.base_url}/v1/query", json={"sql": "SELECT * FROM rewards"}, headers=server.admin
            )
        server.store.wait_normalized(timeout_s=60)
        caught_up = normalizer_metrics(server)
        rewards = httpx.post(
            f"{server.base_url}/v1/query", json={"sql": "SELECT * FROM rewards"}, headers=server.admin
        )

    assert lag["otel_rl_store_normalize_lag_commits"] == 1
    assert 1.5 <= lag["otel_rl_store_normalize_lag_seconds"] <= read - before
    assert health["normalized"]["lag"] == 1
    rounding = 0.001  # /healthz gives the lag to the millisecond
    assert lag["otel_rl_store_normalize_lag_seconds"] - rounding <= health["normalized"]["lag_seconds"]
    assert health["normalized"]["lag_seconds"] <= read - before + rounding
    assert answer.status_code == 503
    detail = answer.json()["detail"]
    match = re.search(
        r"waited 1\.0 s for commit \d+: the normalized tables are 1 commits \(([\d.]+) s\) behind the raw"
        r" tables, since (\d\d:\d\d:\d\d) UTC",
        detail,
    )
    assert match, detail
    assert float(match[1]) >= 2.0  # the query waited its 1 s limit after the 1.5 s pause
    hours, minutes, seconds = (int(part) for part in match[2].split(":"))
    made = (hours * 3600 + minutes * 60 + seconds - int(before) % 86400) % 86400
    assert made <= 5, detail  # when the reward's commit was made, to the second
    assert caught_up["otel_rl_store_normalize_lag_seconds"] == 0
    assert rewards.status_code == 200
