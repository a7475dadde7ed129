"""Archive runs in the server: POST /v1/admin/archive (what `otel-rl archive` asks of a server holding the
store), and `otel-rl serve --archive-after-days/--retain-days/--retain-bytes`: a run at start, then hourly."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Annotated

import duckdb
from anyio import to_thread
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from otel_rl.auth import Auth, admin_required
from otel_rl.store import Store
from otel_rl.store.archiver import ArchiveError
from otel_rl.store.retention import (
    MAX_BYTES,
    MAX_DAYS,
    ArchivePolicy,
    ArchiveReport,
    PolicyError,
    parse_size,
)

if TYPE_CHECKING:
    from fastapi import APIRouter

log = logging.getLogger(__name__)

SCHEDULE_INTERVAL_S = 3600.0  # between the server's archive runs


class ArchiveIn(BaseModel):
    """An archive run: archive the raw rows received before `before` (UTC), then apply the retention asked."""

    before: date | None = None
    retain_days: int | None = Field(None, ge=0, le=MAX_DAYS)
    retain_bytes: int | None = Field(None, ge=1, le=MAX_BYTES)


class ArchiveOut(BaseModel):
    """What the run did."""

    archived_files: int
    archived_rows: dict[str, int]
    archived_bytes: int
    deleted_files: int
    deleted_bytes: int
    deleted_days: list[date]
    deleted_store_rows: int
    renormalized: int  # trace, rollout or session names whose normalized rows are recomputed
    summary: list[str]  # the run in a line per step, as `otel-rl archive` prints it


def archive_out(report: ArchiveReport) -> ArchiveOut:
    archived = report.archived or []
    rows: dict[str, int] = {}
    for file in archived:
        rows[file.raw_table] = rows.get(file.raw_table, 0) + file.rows
    deleted = report.deleted
    return ArchiveOut(
        archived_files=len(archived),
        archived_rows=rows,
        archived_bytes=sum(file.bytes for file in archived),
        deleted_files=deleted.files if deleted else 0,
        deleted_bytes=deleted.bytes if deleted else 0,
        deleted_days=deleted.days if deleted else [],
        deleted_store_rows=deleted.store_rows if deleted else 0,
        renormalized=deleted.renormalize.num_rows if deleted else 0,
        summary=report.lines(),
    )


def archive_router(store: Store, auth: Auth) -> APIRouter:
    """The admin endpoint that runs an archive run on the server's store."""
    # Imported here: ServeSettings holds ScheduleSettings, and every `otel-rl` command imports it
    from fastapi import APIRouter, Depends, HTTPException

    router = APIRouter(tags=["archive"])

    @router.post(
        "/v1/admin/archive",
        summary="Move old raw rows to the store's Parquet archive, and apply retention",
        dependencies=[Depends(admin_required(auth))],
    )
    async def archive(body: ArchiveIn) -> ArchiveOut:
        policy = ArchivePolicy(body.before, body.retain_days, body.retain_bytes)
        try:
            report = await to_thread.run_sync(store.archive, policy)
        except PolicyError as exc:
            raise HTTPException(400, str(exc)) from None
        except (ArchiveError, duckdb.Error, OSError) as exc:
            log.error("an archive run failed: %s", exc)
            raise HTTPException(500, f"the archive run failed: {exc}") from None
        return archive_out(report)

    return router


def _size(value: object) -> object:
    """A size as written (500MB, 20GiB...) in bytes; a number as it is."""
    return parse_size(value) if isinstance(value, str) else value


class ScheduleSettings(BaseModel):
    """`otel-rl serve`'s archive flags (None: that step is not taken)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    archive_after_days: int | None = Field(None, ge=0, le=MAX_DAYS)
    retain_days: int | None = Field(None, ge=0, le=MAX_DAYS)
    retain_bytes: Annotated[Annotated[int, Field(ge=1, le=MAX_BYTES)] | None, BeforeValidator(_size)] = None

    @model_validator(mode="after")
    def _possible_today(self) -> ScheduleSettings:
        """The run made today is possible (the rule `otel-rl archive` applies: PolicyError's message)."""
        today = datetime.now(UTC).date()
        self.policy(today).check(today)
        return self

    @classmethod
    def from_flags(
        cls, archive_after_days: int | None, retain_days: int | None, retain_bytes: str | None
    ) -> ScheduleSettings | None:
        """The settings of the flags (ValidationError when one cannot be used); None when no flag asks for
        a run."""
        if archive_after_days is None and retain_days is None and retain_bytes is None:
            return None
        return cls(archive_after_days=archive_after_days, retain_days=retain_days, retain_bytes=retain_bytes)

    def policy(self, today: date) -> ArchivePolicy:
        """The run to make today."""
        after = self.archive_after_days
        before = None if after is None else today - timedelta(days=after)
        return ArchivePolicy(before, self.retain_days, self.retain_bytes)


class ArchiveSchedule:
    """An archive run at start, then every SCHEDULE_INTERVAL_S, in a thread of its own until `stop()`. A run
    that fails is logged; the next one is tried an interval later."""

    def __init__(self, store: Store, settings: ScheduleSettings) -> None:
        self._store = store
        self._settings = settings
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel-rl-archive", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the run in progress, if any."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stopping.is_set():
            policy = self._settings.policy(datetime.now(UTC).date())
            try:
                for line in self._store.archive(policy).lines():
                    log.info("archive run: %s", line)
            except Exception as exc:  # the thread must go on: the next run may succeed
                log.error("the archive run failed (tried again in an hour): %s", exc)
            self._stopping.wait(SCHEDULE_INTERVAL_S)
