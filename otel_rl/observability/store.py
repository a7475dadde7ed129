"""The store's Prometheus metrics: commit timings; rows, file, WAL and write queue sizes read at scrape."""

import logging
from collections.abc import Iterator
from pathlib import Path

import polars as pl
from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from otel_rl.store import Store, reads
from otel_rl.store.sandbox import QueryFailed, QueryInterrupted
from otel_rl.store.wal import wal_path

log = logging.getLogger(__name__)

ROUND_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
COMMIT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class StoreMetrics(Collector):
    """Commit timings as the writer reports them, and the store's sizes read when Prometheus scrapes."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.commit_seconds = Histogram(
            "otel_rl_store_commit_duration_seconds",
            "Time of one group commit (inserts, WAL write and sync), durable when it ends.",
            buckets=COMMIT_BUCKETS_S,
            registry=None,
        )
        self.commit_batches = Histogram(
            "otel_rl_store_commit_batches",
            "Batches (exports, gateway span flushes) written by one group commit.",
            buckets=BATCH_BUCKETS,
            registry=None,
        )
        self.round_seconds = Histogram(
            "otel_rl_store_normalize_round_duration_seconds",
            "Time of one normalization round: the views' SQL over new commits and their scope, replaced in"
            " the normalized tables.",
            buckets=ROUND_BUCKETS_S,
            registry=None,
        )
        store.writer.commit_observers.append(self._observe)
        store.normalizer.round_observers.append(lambda done: self.round_seconds.observe(done.seconds))

    def _observe(self, seconds: float, batches: int) -> None:
        self.commit_seconds.observe(seconds)
        self.commit_batches.observe(batches)

    def collect(self) -> Iterator[Metric]:
        yield from self.commit_seconds.collect()
        yield from self.commit_batches.collect()
        yield from self.round_seconds.collect()
        store, writer, normalizer = self.store, self.store.writer, self.store.normalizer
        yield GaugeMetricFamily(
            "otel_rl_store_normalize_lag_commits",
            "Commits written but not in the normalized tables yet (queries of them wait for it).",
            value=normalizer.lag,
        )
        yield GaugeMetricFamily(
            "otel_rl_store_normalize_lag_seconds",
            "How long the oldest commit not in the normalized tables yet has waited for them (0: caught up).",
            value=normalizer.lag_seconds,
        )
        yield CounterMetricFamily(
            "otel_rl_store_normalized_rows",
            "Raw rows normalized (with their scopes' earlier rows).",
            value=normalizer.rows,
        )
        yield CounterMetricFamily(
            "otel_rl_store_normalized_scope_traces",
            "Traces in the rounds' scopes (their new commits closed over the rollouts and sessions named).",
            value=normalizer.scope_traces,
        )
        yield GaugeMetricFamily(
            "otel_rl_store_normalize_failing",
            "1 while normalization rounds fail (raw rows are kept; queries of the normalized tables wait).",
            value=float(normalizer.failure is not None),
        )
        yield GaugeMetricFamily(
            "otel_rl_store_normalize_skipped_commits",
            "Commits whose rows the views could not normalize (kept in the raw tables; see `otel-rl store"
            " check`).",
            value=len(normalizer.skipped),
        )
        yield CounterMetricFamily("otel_rl_store_commits", "Group commits so far.", value=writer.commits)
        yield GaugeMetricFamily(
            "otel_rl_store_write_queue_bytes",
            "Arrow bytes queued for the next commit (exports get 429 when it is full).",
            value=writer.pending_bytes,
        )
        yield GaugeMetricFamily(
            "otel_rl_store_writes_failing",
            "1 while the store refuses writes (a full disk, an I/O error), else 0.",
            value=float(store.write_failure is not None),
        )
        yield GaugeMetricFamily(
            "otel_rl_store_file_size_bytes", "Size of the DuckDB file.", value=_size(store.path)
        )
        yield GaugeMetricFamily(
            "otel_rl_store_wal_size_bytes",
            "Size of the WAL: commits not yet checkpointed into the file, replayed after a crash.",
            value=_size(wal_path(store.path)),
        )
        try:
            # DuckDB's own row counts: a scrape reads no rows
            counts = reads.table_rows(lambda sql, params: pl.from_arrow(store.query_arrow(sql, params)))
        except (
            QueryFailed,
            QueryInterrupted,
        ) as exc:  # e.g. invalidated until reopened: the rest still counts
            log.warning("/metrics without the store's row counts: %s", exc)
            return
        rows = GaugeMetricFamily(
            "otel_rl_store_rows", "Rows of each store table, as DuckDB keeps count of them.", labels=["table"]
        )
        for table_name, estimated_size in counts.iter_rows():
            rows.add_metric([table_name], estimated_size)
        yield rows


def _size(path: Path) -> float:
    try:
        return float(path.stat().st_size)
    except FileNotFoundError:  # no WAL after a checkpoint
        return 0.0
