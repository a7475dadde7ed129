"""The web view at /ui: its static page (public) and the JSON endpoints it reads (admin token only)."""

from __future__ import annotations

import io
import json
import time
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import polars as pl
import pyarrow as pa
from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, RedirectResponse, Response
from pydantic import BaseModel, Field

from otel_rl.auth import Auth, admin_required
from otel_rl.csv_text import csv_text
from otel_rl.input_rules import MAX_ID_CHARS  # rollout, group, task and run ids (HTTP 422 if longer)
from otel_rl.query_api import QuerySlots, json_bytes
from otel_rl.store import Store, ui_reads
from otel_rl.store.reads import Params, Run
from otel_rl.store.sandbox import (
    QueryFailed,
    QueryInterrupted,
    QueryTimeout,
    ReadOnlyViolation,
    ResultTooLarge,
)
from otel_rl.transforms.staleness import versions_behind
from otel_rl.ui.inspector import RolloutNotFound, Tokenizer, rollout_samples

STATIC = Path(__file__).parent / "static"
# Served by name only: nothing else under the package can be asked for.
ASSETS = {path.name: path for path in STATIC.iterdir() if path.suffix in (".html", ".js", ".css", ".svg")}
MEDIA_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
# The page runs only its own scripts and talks only to its server: stored text can never run as code.
CSP = "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
MAX_RESULT_BYTES = 64 * 1024 * 1024  # one page's data; the SQL box goes through /v1/query and its limits
RolloutId = Annotated[str, PathParam(min_length=1, max_length=MAX_ID_CHARS)]
RunId = Annotated[str | None, Query(max_length=MAX_ID_CHARS, description="default: the latest run")]
TrainingChart = Literal["steps", "evals", "reloads", "staleness"]


class Format(StrEnum):
    json = "json"
    csv = "csv"
    parquet = "parquet"


FormatParam = Annotated[Format, Query(description="json, or a download: csv, parquet")]


class RolloutFilter(BaseModel):
    """The rollouts table's filters (each optional), as query parameters."""

    split: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    status: str | None = Field(default=None, max_length=64)
    min_reward: float | None = Field(default=None, allow_inf_nan=False)
    max_reward: float | None = Field(default=None, allow_inf_nan=False)
    group: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    task: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    harness: str | None = Field(default=None, max_length=MAX_ID_CHARS, description="service.name")
    since: datetime | None = None
    until: datetime | None = None
    flagged: bool | None = Field(default=None, description="flagged by a hack detector (hack_flags) or not")
    detector: str | None = Field(default=None, max_length=MAX_ID_CHARS, description="flagged by this one")
    limit: int = Field(default=200, ge=1, le=5000)
    offset: int = Field(default=0, ge=0, le=10_000_000)


def ui_router(
    store: Store, auth: Auth, *, tokenizer_folder: Path | None, timeout_s: float, slots: QuerySlots
) -> APIRouter:
    """The /ui page and its data; `tokenizer_folder`: a model folder whose tokenizer decodes token ids.

    Each request's queries together stay within `timeout_s` (--query-timeout), each in one of `slots`."""
    router = APIRouter(tags=["ui"])
    admin = [Depends(admin_required(auth))]
    tokenizer = Tokenizer(tokenizer_folder)

    def run(sql: str, params: Params | None, deadline: float) -> pl.DataFrame:
        left = deadline - time.monotonic()
        if left <= 0:
            raise HTTPException(408, f"the page's queries took longer than {timeout_s:g} s (--query-timeout)")
        try:
            with slots.held():
                query = store.user_query(
                    sql, max_result_bytes=MAX_RESULT_BYTES, timeout_s=left, params=params
                )
                return pl.from_arrow(query.run())
        except (ReadOnlyViolation, QueryFailed) as exc:  # the SQL is ours: a failure here is a server bug
            raise HTTPException(500, f"the view's query failed: {exc}") from None
        except ResultTooLarge as exc:
            raise HTTPException(413, str(exc)) from None
        except QueryTimeout as exc:
            raise HTTPException(408, str(exc)) from None
        except QueryInterrupted as exc:
            raise HTTPException(503, str(exc), headers={"Retry-After": "1"}) from None

    def within() -> Run:
        """The reads of one request: together within the deadline of its queries."""
        deadline = time.monotonic() + timeout_s
        return lambda sql, params: run(sql, params, deadline)

    @router.get("/ui", include_in_schema=False)
    def ui_root() -> RedirectResponse:
        return RedirectResponse("/ui/")

    @router.get("/ui/", include_in_schema=False)
    def ui_page() -> FileResponse:
        return FileResponse(
            STATIC / "index.html", media_type="text/html", headers={"Content-Security-Policy": CSP}
        )

    @router.get("/ui/assets/{name}", include_in_schema=False)
    def ui_asset(name: str) -> FileResponse:
        path = ASSETS.get(name)
        if path is None:
            raise HTTPException(404, f"no asset {name!r}")
        return FileResponse(path, media_type=MEDIA_TYPES[path.suffix], headers={"Cache-Control": "no-cache"})

    @router.get("/ui/api/rollouts", dependencies=admin, summary="The rollouts table, filtered, newest first")
    def rollouts(filters: Annotated[RolloutFilter, Query()], format: FormatParam = Format.json) -> Response:
        table = ui_reads.rollouts_page(within(), **filters.model_dump())
        more = table.height > filters.limit
        table = table.slice(0, filters.limit)
        if format is not Format.json:
            return download(table, "rollouts", format)
        return Response(
            json.dumps({"rows": rows(table), "more": more, "offset": filters.offset}).encode(),
            media_type="application/json",
        )

    @router.get("/ui/api/rollouts/{rollout_id}", dependencies=admin, summary="One rollout and its timeline")
    def rollout(rollout_id: RolloutId) -> dict[str, Any]:
        read = within()
        found = ui_reads.rollout(read, rollout_id)
        if found.height == 0:
            raise HTTPException(404, f"no rollout {rollout_id!r} in the store")
        return {
            "rollout": rows(found)[0],
            "calls": rows(ui_reads.rollout_timeline_calls(read, rollout_id)),
            "tools": rows(ui_reads.rollout_tools(read, rollout_id)),
            "steps": rows(ui_reads.rollout_steps(read, rollout_id)),
            "rewards": rows(ui_reads.rollout_reward_rows(read, rollout_id)),
            "detections": rows(ui_reads.rollout_detections(read, rollout_id)),
        }

    @router.get(
        "/ui/api/rollouts/{rollout_id}/samples",
        dependencies=admin,
        summary="A rollout's training samples token by token (the inspector)",
    )
    def samples(rollout_id: RolloutId, format: FormatParam = Format.json) -> Response:
        try:
            inspected = rollout_samples(rollout_id, within(), tokenizer)
        except RolloutNotFound as exc:
            raise HTTPException(404, str(exc)) from None
        if format is not Format.json:
            segments = pl.from_arrow(token_table(inspected["segments"]))
            return download(segments, f"samples-{rollout_id[:40]}", format)
        return Response(json.dumps(inspected).encode(), media_type="application/json")

    @router.get("/ui/api/training/runs", dependencies=admin, summary="The training runs the store recorded")
    def training_runs() -> list[dict[str, Any]]:
        return rows(ui_reads.training_runs(within()))

    @router.get("/ui/api/training/{chart}", dependencies=admin, summary="One chart of the training page")
    def training(chart: TrainingChart, run_id: RunId = None, format: FormatParam = Format.json) -> Response:
        read = within()
        if chart == "steps":
            table = ui_reads.training_steps(read, run_id)
        elif chart == "evals":
            table = ui_reads.training_evals(read, run_id)
        elif chart == "staleness":
            table = staleness(ui_reads.step_rollout_versions(read, run_id))
        else:
            table = ui_reads.reloads(read, run_started_ms(run_id, read))
        if format is not Format.json:
            return download(table, f"training-{chart}", format)
        return Response(json_bytes(table), media_type="application/json")

    def run_started_ms(run_id: str | None, read: Run) -> int | None:
        runs = rows(ui_reads.training_runs(read))
        chosen = [r for r in runs if r["run_id"] == run_id] if run_id else runs[:1]
        return chosen[0]["started_ms"] if chosen else None

    return router


def staleness(versions: pl.DataFrame) -> pl.DataFrame:
    """Per step: how many policy versions behind the policy it trained its rollouts were sampled, at most and
    on average (the staleness rule: transforms/staleness.py). A step span records the version it produced,
    one more than the version it trained."""
    lag = versions_behind(pl.col("policy_version_min"), pl.col("policy_version") - 1)
    return (
        versions.group_by("step")
        .agg(lag.max().alias("max_lag"), lag.mean().alias("mean_lag"), pl.len().alias("rollouts"))
        .sort("step")
    )


def rows(table: pl.DataFrame) -> list[dict[str, Any]]:
    """A frame as JSON-ready row objects (binary as base64, timestamps as ISO text)."""
    return json.loads(json_bytes(table)) if table.height else []


def token_table(segments: list[dict[str, Any]]) -> pa.Table:
    """The inspector's tokens as one table: a row per token of every segment."""
    columns: dict[str, list] = {k: [] for k in ("segment_id", "position", "token_id", "text", "trained")}
    columns |= {"vllm_logprob": [], "advantage": [], "call_span_id": []}
    for segment in segments:
        owner = [None] * len(segment["ids"])
        for call in segment["calls"]:
            owner[call["start"] : call["end"]] = [call["span_id"]] * (call["end"] - call["start"])
        text = segment["text"] or [None] * len(segment["ids"])
        for position, token in enumerate(segment["ids"]):
            columns["segment_id"].append(segment["segment_id"])
            columns["position"].append(position)
            columns["token_id"].append(token)
            columns["text"].append(text[position])
            columns["trained"].append(bool(segment["mask"][position]))
            columns["vllm_logprob"].append(segment["logprob"][position])
            columns["advantage"].append(segment["advantage_per_token"][position])
            columns["call_span_id"].append(owner[position])
    return pa.table(columns)


def download(frame: pl.DataFrame, name: str, format: Format) -> Response:
    """A frame as a CSV or Parquet file to save."""
    if format is Format.csv:
        body, media = csv_text(frame).encode(), "text/csv"
    else:
        buffer = io.BytesIO()
        frame.write_parquet(buffer)
        body, media = buffer.getvalue(), "application/vnd.apache.parquet"
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    headers = {"Content-Disposition": f'attachment; filename="{safe}.{format.value}"'}
    return Response(body, media_type=media, headers=headers)
