"""The web view at /ui: its static page (public) and the JSON endpoints it reads (admin token only)."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import polars as pl
import pyarrow as pa
from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, RedirectResponse, Response

from otel_rl.auth import Auth, admin_required
from otel_rl.csv_text import csv_text
from otel_rl.query_api import QuerySlots, json_bytes
from otel_rl.store import Store
from otel_rl.store.sandbox import (
    QueryFailed,
    QueryInterrupted,
    QueryTimeout,
    ReadOnlyViolation,
    ResultTooLarge,
)
from otel_rl.ui import queries
from otel_rl.ui.inspector import RolloutNotFound, Tokenizer, rollout_samples

STATIC = Path(__file__).parent / "static"
# Served by name only: nothing else under the package can be asked for.
ASSETS = {path.name: path for path in STATIC.iterdir() if path.suffix in (".html", ".js", ".css", ".svg")}
MEDIA_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
# The page runs only its own scripts and talks only to its server: stored text can never run as code.
CSP = "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
MAX_RESULT_BYTES = 64 * 1024 * 1024  # one page's data; the SQL box goes through /v1/query and its limits
RolloutId = Annotated[str, PathParam(min_length=1, max_length=queries.MAX_ID_CHARS)]
RunId = Annotated[str | None, Query(max_length=queries.MAX_ID_CHARS, description="default: the latest run")]
TrainingChart = Literal["steps", "evals", "reloads", "staleness"]


class Format(StrEnum):
    json = "json"
    csv = "csv"
    parquet = "parquet"


FormatParam = Annotated[Format, Query(description="json, or a download: csv, parquet")]


def ui_router(
    store: Store, auth: Auth, *, tokenizer_folder: Path | None, timeout_s: float, slots: QuerySlots
) -> APIRouter:
    """The /ui page and its data; `tokenizer_folder`: a model folder whose tokenizer decodes token ids.

    Each request's queries together stay within `timeout_s` (--query-timeout), each in one of `slots`."""
    router = APIRouter(tags=["ui"])
    admin = [Depends(admin_required(auth))]
    tokenizer = Tokenizer(tokenizer_folder)

    def within() -> float:
        """The deadline of a request's queries."""
        return time.monotonic() + timeout_s

    def run(sql: str, deadline: float) -> pa.Table:
        left = deadline - time.monotonic()
        if left <= 0:
            raise HTTPException(408, f"the page's queries took longer than {timeout_s:g} s (--query-timeout)")
        try:
            with slots.held():
                query = store.user_query(sql, max_result_bytes=MAX_RESULT_BYTES, timeout_s=left)
                return query.run()
        except (ReadOnlyViolation, QueryFailed) as exc:  # the SQL is ours: a failure here is a server bug
            raise HTTPException(500, f"the view's query failed: {exc}") from None
        except ResultTooLarge as exc:
            raise HTTPException(413, str(exc)) from None
        except QueryTimeout as exc:
            raise HTTPException(408, str(exc)) from None
        except QueryInterrupted as exc:
            raise HTTPException(503, str(exc), headers={"Retry-After": "1"}) from None

    def frames(deadline: float) -> Callable[[str], pl.DataFrame]:
        return lambda sql: pl.from_arrow(run(sql, deadline))

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
    def rollouts(
        filters: Annotated[queries.RolloutFilter, Query()], format: FormatParam = Format.json
    ) -> Response:
        table = run(queries.rollouts_sql(filters), within())
        more = table.num_rows > filters.limit
        table = table.slice(0, filters.limit)
        if format is not Format.json:
            return download(table, "rollouts", format)
        return Response(
            json.dumps({"rows": rows(table), "more": more, "offset": filters.offset}).encode(),
            media_type="application/json",
        )

    @router.get("/ui/api/rollouts/{rollout_id}", dependencies=admin, summary="One rollout and its timeline")
    def rollout(rollout_id: RolloutId) -> dict[str, Any]:
        deadline = within()
        found = run(queries.rollout_sql(rollout_id), deadline)
        if found.num_rows == 0:
            raise HTTPException(404, f"no rollout {rollout_id!r} in the store")
        return {
            "rollout": rows(found)[0],
            "calls": rows(run(queries.rollout_calls_sql(rollout_id), deadline)),
            "tools": rows(run(queries.rollout_tools_sql(rollout_id), deadline)),
            "steps": rows(run(queries.rollout_steps_sql(rollout_id), deadline)),
            "rewards": rows(run(queries.rollout_rewards_sql(rollout_id), deadline)),
        }

    @router.get(
        "/ui/api/rollouts/{rollout_id}/samples",
        dependencies=admin,
        summary="A rollout's training samples token by token (the inspector)",
    )
    def samples(rollout_id: RolloutId, format: FormatParam = Format.json) -> Response:
        try:
            inspected = rollout_samples(rollout_id, frames(within()), tokenizer)
        except RolloutNotFound as exc:
            raise HTTPException(404, str(exc)) from None
        if format is not Format.json:
            return download(token_table(inspected["segments"]), f"samples-{rollout_id[:40]}", format)
        return Response(json.dumps(inspected).encode(), media_type="application/json")

    @router.get("/ui/api/training/runs", dependencies=admin, summary="The training runs the store recorded")
    def training_runs() -> list[dict[str, Any]]:
        return rows(run(queries.training_runs_sql(), within()))

    @router.get("/ui/api/training/{chart}", dependencies=admin, summary="One chart of the training page")
    def training(chart: TrainingChart, run_id: RunId = None, format: FormatParam = Format.json) -> Response:
        deadline = within()
        if chart == "steps":
            table = run(queries.training_steps_sql(run_id), deadline)
        elif chart == "evals":
            table = run(queries.training_evals_sql(run_id), deadline)
        elif chart == "staleness":
            table = run(queries.staleness_sql(run_id), deadline)
        else:
            table = run(queries.reloads_sql(run_started_ms(run_id, deadline)), deadline)
        if format is not Format.json:
            return download(table, f"training-{chart}", format)
        return Response(json_bytes(table), media_type="application/json")

    def run_started_ms(run_id: str | None, deadline: float) -> int | None:
        runs = rows(run(queries.training_runs_sql(), deadline))
        chosen = [r for r in runs if r["run_id"] == run_id] if run_id else runs[:1]
        return chosen[0]["started_ms"] if chosen else None

    return router


def rows(table: pa.Table) -> list[dict[str, Any]]:
    """A table as JSON-ready row objects (binary as base64, timestamps as ISO text)."""
    return json.loads(json_bytes(table)) if table.num_rows else []


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


def download(table: pa.Table, name: str, format: Format) -> Response:
    """A table as a CSV or Parquet file to save."""
    frame = pl.from_arrow(table)
    if format is Format.csv:
        body, media = csv_text(frame).encode(), "text/csv"
    else:
        buffer = io.BytesIO()
        frame.write_parquet(buffer)
        body, media = buffer.getvalue(), "application/vnd.apache.parquet"
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    headers = {"Content-Disposition": f'attachment; filename="{safe}.{format.value}"'}
    return Response(body, media_type=media, headers=headers)
