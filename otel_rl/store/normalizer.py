"""When rounds run (normalize.py says what one does): a thread that follows the writer's commits, lets readers
wait for the commits they saw, and keeps going past rows the views cannot normalize."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime

import duckdb

from otel_rl.store import normalize
from otel_rl.store.archive import RawRows
from otel_rl.store.definitions import SqlFile, defined_normalized
from otel_rl.store.normalize import RAW, ROUND_ROWS, STATE, NormalizeError, Round
from otel_rl.store.sandbox import QueryInterrupted
from otel_rl.store.writer import is_storage_failure

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1.0  # after a round failed for the storage's sake (a full disk), before trying again
# While no reader waits, a round starts at the earliest this long after the last one ended (at most): a
# round's planning costs the same for one row as for thousands, so under steady ingest rounds grow rather
# than take a core.
MAX_GAP_S = 1.0
NICE = 10  # the background thread's scheduling priority (Linux nice value: higher is lower)
PREEMPT_POLL_S = 0.05  # a reader interrupts a background round again this often until it has stopped
# Commits made within this long of each other share one entry of the record of when commits were made (the
# lag in seconds is that much coarse at most, and the record holds one entry per stretch, not per commit).
COMMIT_TIME_GRAIN_S = 0.05
Cursor = Callable[[], tuple[duckdb.DuckDBPyConnection, int]]  # a new cursor of the store, and its generation


class NotNormalized(QueryInterrupted):
    """The normalized tables did not catch up with the commits a read must see in time (HTTP 503)."""


class Normalizer:
    """Keeps the store's normalized tables caught up with its commits, in a thread of its own.

    `committed(seq)` after each commit; `wait_for(seq, timeout_s)` blocks a reader until the tables include
    commit `seq`; `close()` catches up, then stops.
    """

    def __init__(
        self,
        cursor: Cursor,  # a new cursor of the store, and its generation (a new one after each reopen)
        files: list[SqlFile],
        fingerprint: str,
        *,
        through: int,
        committed: int,
        fills: dict[str, str] | None = None,
    ) -> None:
        self._cursor = cursor
        self._files = files
        self._fingerprint = fingerprint
        self._fills = fills  # built on the first round when the store did not build them at open
        self._fills_generation = self._generation() if fills is not None else -1
        self._broken = False  # the view definitions fail: no round can run until the store reopens
        # A store whose SQL defines no normalized view (a bench's raw store) has nothing to maintain.
        self._maintains = bool(defined_normalized(files))
        self._through = through if self._maintains else committed
        self._committed = committed
        self._waiters = 0
        self._closing = False
        self._wake = threading.Condition()
        self._in_round = threading.Lock()  # held through each round: see paused() and wait_for()
        self._preemptible: duckdb.DuckDBPyConnection | None = None  # the background round's cursor
        self.failure: str | None = None  # why rounds fail now, until one succeeds
        self.last_round: Round | None = None
        self.rounds = 0
        self.rows = 0  # raw rows the rounds read (a scope's earlier rows again each time it grows)
        self.scope_traces = 0  # traces in the rounds' scopes (a trace again in each round whose scope has it)
        self.round_observers: list[Callable[[Round], None]] = []
        # (first commit of a stretch, when it was made: Unix time) of the commits not normalized yet; those
        # pending at open are dated by the open (when they were made is not recorded).
        self._made: deque[tuple[int, float]] = deque()
        if self._through < committed:
            self._made.append((self._through + 1, time.time()))
        self._skipped = self._read_skipped()
        self._thread = threading.Thread(target=self._run, name="otel-rl-normalizer", daemon=True)
        self._thread.start()

    @property
    def through(self) -> int:
        """The last commit the normalized tables include."""
        return self._through

    @property
    def skipped(self) -> frozenset[int]:
        """Commits whose rows the views could not normalize (their rows stay in the raw tables)."""
        return self._skipped

    @property
    def lag(self) -> int:
        """Commits written but not normalized yet."""
        return max(0, self._committed - self._through)

    @property
    def behind_since(self) -> float | None:
        """When the oldest commit not normalized yet was made (Unix time); None when caught up."""
        with self._wake:
            return self._made[0][1] if self._made and self.lag else None

    @property
    def lag_seconds(self) -> float:
        """How long the oldest commit not normalized yet has waited (0 when caught up)."""
        since = self.behind_since
        return 0.0 if since is None else max(0.0, time.time() - since)

    def behind(self) -> str:
        """How far behind the normalized tables are, since when, and how fast rounds go: a reader's answer
        when it could not wait long enough."""
        lag, since, last = self.lag, self.behind_since, self.last_round
        if since is None:
            return "the normalized tables have caught up"
        at = datetime.fromtimestamp(since, UTC).strftime("%H:%M:%S")
        text = f"the normalized tables are {lag} commits ({time.time() - since:.1f} s) behind the raw tables"
        text += f", since {at} UTC"
        if self.failure:
            return f"{text} ({self.failure})"
        if last is not None and last.seconds > 0 and last.commits > 0:
            rate = last.commits / last.seconds
            text += f"; they normalize about {rate:.0f} commits/s: retry in about {lag / rate:.0f} s"
        return text

    def committed(self, seq: int) -> None:
        """The writer committed `seq`: normalize it soon."""
        with self._wake:
            if seq > self._committed and self._maintains:
                now = time.time()
                if not self._made or now - self._made[-1][1] >= COMMIT_TIME_GRAIN_S:
                    self._made.append((self._committed + 1, now))
            self._committed = max(self._committed, seq)
            if not self._maintains:
                self._through = self._committed
            self._wake.notify_all()

    def wait_for(self, seq: int, timeout_s: float | None) -> bool:
        """Block until the normalized tables include commit `seq`; False when `timeout_s` passed first.

        The waiting thread runs the rounds itself, at its own priority: a round of the background thread
        (which runs below ingest) in progress is interrupted, and its work done here.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._wake:
            self._waiters += 1
            self._wake.notify_all()  # a pause between background rounds ends for a waiting reader
        try:
            while self._through < seq:
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                if not self._broken and self._in_round.acquire(blocking=False):
                    try:
                        self._round_here(deadline, seq)
                    finally:
                        self._in_round.release()
                    continue
                self._preempt()
                with self._wake:
                    self._wake.wait(PREEMPT_POLL_S)
            return True
        finally:
            with self._wake:
                self._waiters -= 1
                self._wake.notify_all()  # the background thread goes on when no reader waits

    def paused(self) -> threading.Lock:
        """Held, no round runs (its cursor is closed): the store reopens its connection under it."""
        return self._in_round

    def close(self) -> None:
        """Normalize every commit made so far, then stop."""
        with self._wake:
            self._closing = True
            self._wake.notify_all()
        self._thread.join()

    # ---------------------------------------------------------------- the thread

    def _run(self) -> None:
        # Below ingest in the OS's eyes: exports are answered first, normalizing takes the cores they leave
        # (DuckDB runs a statement on the thread that calls it: one thread per connection, see connect()).
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        while True:
            with self._wake:
                # While readers wait, they run the rounds (at their priority): this thread stands aside.
                while not self._closing and (self._waiters or self._broken or self.lag == 0):
                    self._wake.wait()
                if self._committed <= self._through or self._broken:
                    return  # closing, and caught up (or unable to)
                gap = 0.0 if self.last_round is None else min(self.last_round.seconds, MAX_GAP_S)
                pause_until = time.monotonic() + gap  # commits arriving meanwhile join the next round
                while not (self._closing or self._waiters) and (left := pause_until - time.monotonic()) > 0:
                    self._wake.wait(left)
                if self._waiters and not self._closing:
                    continue
            try:
                self._round()
            except duckdb.InterruptException:
                continue  # a waiting reader took the round over
            except Exception as exc:  # the thread must survive: readers would wait for ever
                if self._closing:  # the next open goes on from the durable watermark
                    log.error("normalizing stopped with the store, %d commits behind: %s", self.lag, exc)
                    return
                self._failed(exc)

    def _round(self) -> None:
        """A round of the background thread (interruptible: see wait_for)."""
        with self._in_round:
            self._round_on_cursor(preemptible=True)

    def _round_here(self, deadline: float | None, seq: int) -> None:
        """A round on a waiting reader's thread (the round lock held) up to the commit `seq` it needs (not
        the ones made since: the online loop's reads need only what their status poll saw), stopped at the
        reader's deadline (its query's limit holds however much there is to normalize); a failure is
        recorded, not raised."""
        if self._committed <= self._through:
            return
        try:
            self._round_on_cursor(preemptible=False, deadline=deadline, upto=seq)
        except duckdb.InterruptException:
            return  # past the reader's deadline: the next reader or the background thread goes on
        except Exception as exc:
            self._failed(exc)

    def _preempt(self) -> None:
        running = self._preemptible
        if running is not None:
            with contextlib.suppress(duckdb.Error):  # it ended meanwhile
                running.interrupt()

    def _round_on_cursor(
        self, *, preemptible: bool, deadline: float | None = None, upto: int | None = None
    ) -> None:
        con, generation = self._cursor()
        watch_ended = threading.Event()
        watch = threading.Thread(target=_interrupt_at, args=(con, deadline, watch_ended), daemon=True)
        try:
            if self._fills is None or generation != self._fills_generation:
                self._fills, errors = normalize.build_scratch(con, self._files)
                self._fills_generation = generation
                self._check_fills(errors)
            self._preemptible = con if preemptible else None  # from here on: not while building the scratch
            if deadline is not None:
                watch.start()
            since = self._through
            # A round an interrupt (wait_for's) reached after its COMMIT ended in an error with its work
            # stored: the stored watermark says so, and its commits are not normalized again (they were
            # read twice: a reward twice in `rewards`).
            stored, _ = normalize.read_state(con)
            if stored > since:
                self._advance(stored)
                return
            until = self._round_end(con, since, self._committed if upto is None else upto)
            try:
                done = self._normalize(con, since, until)
            except (duckdb.Error, NormalizeError) as exc:
                if _not_the_datas_fault(exc) or until == since + 1:
                    raise
                # Find the commit the views cannot normalize: one commit a round until it fails alone.
                log.warning("normalizing commits %d-%d failed (%s): one by one now", since + 1, until, exc)
                done = self._normalize(con, since, since + 1)
        finally:
            self._preemptible = None
            watch_ended.set()
            if watch.is_alive():
                watch.join()
            con.close()
        if self.failure is not None:
            log.warning("normalizing works again (after: %s)", self.failure)
            self.failure = None
        self._done(done)

    def _check_fills(self, errors: dict[str, str]) -> None:
        """Refuse rounds with view definitions that fail (the SQL must be fixed, then the store reopened)."""
        missing = [name for name in defined_normalized(self._files) if name not in (self._fills or {})]
        if not missing:
            return
        self._broken = True
        causes = "; ".join(f"{file}: {error}" for file, error in errors.items())
        raise NormalizeError(f"the normalized views {', '.join(missing)} cannot be created ({causes})")

    def _normalize(self, con: duckdb.DuckDBPyConnection, since: int, until: int) -> Round:
        try:
            return self._run_round(con, since, until)
        except (duckdb.Error, NormalizeError) as exc:
            if until != since + 1 or _not_the_datas_fault(exc):
                raise
            # This commit's rows make the views fail: keep them (raw), skip them, say so, and go on.
            log.error("commit %d cannot be normalized, its rows stay in the raw tables only: %s", until, exc)
            self._skip(con, until, str(exc))
            return self._run_round(con, since, until)  # the watermark moves past it

    def _run_round(self, con: duckdb.DuckDBPyConnection, since: int, until: int) -> Round:
        return normalize.run_round(
            con, self._fills, since=since, until=until, skipped=self._skipped, fingerprint=self._fingerprint
        )

    def _round_end(self, con: duckdb.DuckDBPyConnection, since: int, upto: int) -> int:
        """The last commit of the next round: every commit made up to `upto`, or fewer when they hold over
        ROUND_ROWS rows (in the store or, when the store normalizes everything again, in its archive)."""
        committed = max(since + 1, min(upto, self._committed))
        commits = range(since + 1, committed + 1)
        raw = RawRows(con)
        sizes = con.execute(
            "SELECT commit_seq, count(*) FROM ("
            + " UNION ALL ".join(
                f"SELECT commit_seq FROM ({raw.rows(table, commits)})"
                f" WHERE commit_seq > {since} AND commit_seq <= {committed}"
                for table in RAW
            )
            + ") GROUP BY 1 ORDER BY 1"
        ).fetchall()
        total = 0
        for commit, rows in sizes:
            total += rows
            if total > ROUND_ROWS and commit > sizes[0][0]:
                return int(commit) - 1
        return committed

    def _done(self, done: Round) -> None:
        self.last_round = done
        self.rounds += 1
        self.rows += done.rows
        self.scope_traces += done.scope_traces
        self._advance(done.through)
        for observe in self.round_observers:
            observe(done)

    def _advance(self, through: int) -> None:
        with self._wake:
            self._through = through
            while len(self._made) > 1 and self._made[1][0] <= through + 1:
                self._made.popleft()  # the stretch of the oldest pending commit is the first one kept
            if self.lag == 0:
                self._made.clear()
            self._wake.notify_all()

    def _failed(self, exc: Exception) -> None:
        """Say why (once per outage), then wait a little before the next try."""
        if self.failure is None:
            log.error("normalizing the store's new rows fails (raw rows are kept; readers wait): %s", exc)
        self.failure = f"normalizing new rows fails: {exc}"
        with self._wake:
            self._wake.wait(RETRY_AFTER_S)

    def _skip(self, con: duckdb.DuckDBPyConnection, commit: int, error: str) -> None:
        con.execute(
            f"INSERT INTO {STATE}.skipped VALUES (?, ?, ?)", [commit, error[:2000], datetime.now(UTC)]
        )
        self._skipped = self._skipped | {commit}

    def _generation(self) -> int:
        con, generation = self._cursor()
        con.close()
        return generation

    def _read_skipped(self) -> frozenset[int]:
        con, _ = self._cursor()
        try:
            return frozenset(c for (c,) in con.execute(f"SELECT commit_seq FROM {STATE}.skipped").fetchall())
        finally:
            con.close()


def _interrupt_at(con: duckdb.DuckDBPyConnection, deadline: float, ended: threading.Event) -> None:
    """Interrupt `con` from `deadline` on, again at each tick until `ended`: an interrupt stops only the
    statement running, and a round runs several."""
    while not ended.wait(PREEMPT_POLL_S):
        if time.monotonic() >= deadline:
            with contextlib.suppress(duckdb.Error):
                con.interrupt()


def _not_the_datas_fault(exc: Exception) -> bool:
    """Whether a round failed for a reason other than its rows: the storage, or a reader taking it over."""
    return is_storage_failure(exc) or isinstance(exc, duckdb.InterruptException)
