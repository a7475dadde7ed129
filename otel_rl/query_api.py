"""POST /v1/query: one read-only SQL statement over the store, answered as an Arrow IPC stream or JSON."""

import duckdb
import polars as pl
import pyarrow as pa
from anyio import to_thread
from fastapi import APIRouter, Header, HTTPException, Response
from pydantic import BaseModel

from otel_rl.auth import Auth, Forbidden, Unauthorized
from otel_rl.store import ReadOnlyViolation, Store

ARROW_STREAM = "application/vnd.apache.arrow.stream"


class QueryIn(BaseModel):
    """The body of a query request."""

    sql: str


def arrow_stream_bytes(table: pa.Table) -> bytes:
    """A table as an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def query_router(store: Store, auth: Auth) -> APIRouter:
    """The query endpoint (admin token only); writes and other non-SELECT statements get a 400."""
    router = APIRouter(tags=["query"])

    @router.post("/v1/query", summary="Run one read-only SQL statement over the store")
    async def run_query(
        body: QueryIn,
        authorization: str | None = Header(default=None),
        accept: str | None = Header(default=None),
    ) -> Response:
        try:
            auth.require_admin(authorization)
        except Unauthorized as exc:
            raise HTTPException(401, str(exc)) from None
        except Forbidden as exc:
            raise HTTPException(403, str(exc)) from None
        try:
            table = await to_thread.run_sync(store.query_arrow, body.sql)
        except ReadOnlyViolation as exc:
            raise HTTPException(400, f"query refused: {exc}") from None
        except duckdb.Error as exc:
            raise HTTPException(400, f"query failed: {exc}") from None
        if accept and "application/json" in accept:
            return Response(pl.from_arrow(table).write_json(), media_type="application/json")
        return Response(arrow_stream_bytes(table), media_type=ARROW_STREAM)

    return router
