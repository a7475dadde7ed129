"""POST /v1/query: one read-only SQL statement over the store, answered as an Arrow IPC stream or JSON."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import anyio
import polars as pl
import pyarrow as pa
from anyio import from_thread, to_thread
from fastapi import APIRouter, Depends, Header, HTTPException, Request, Response
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    StringConstraints,
)

from otel_rl.auth import Auth, admin_required
from otel_rl.query import SEEN_THROUGH_HEADER
from otel_rl.store import Store
from otel_rl.store.sandbox import (
    MAX_PARAMS,
    QueryFailed,
    QueryInterrupted,
    QueryTimeout,
    ReadOnlyViolation,
    ResultTooLarge,
    UserQuery,
)

ARROW_STREAM = "application/vnd.apache.arrow.stream"
MAX_SQL_BYTES = 1024 * 1024  # the request body, read before anything else
# A statement's parameters: bounded in number and size before DuckDB sees them, scalars only (a list or an
# object as a value is refused: nothing nested to allocate).
MAX_PARAM_CHARS = 65_536
ParamValue = (
    Annotated[StrictStr, StringConstraints(max_length=MAX_PARAM_CHARS)]
    | StrictInt
    | StrictFloat
    | StrictBool
    | None
)
ParamName = Annotated[StrictStr, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]
QUEUE_WAIT_S = 2.0  # how long a query waits for a free slot before it is refused
DISCONNECT_POLL_S = 0.1


class QueryIn(BaseModel):
    """The body of a query request."""

    sql: str
    params: (
        Annotated[list[ParamValue], Field(max_length=MAX_PARAMS)]
        | Annotated[dict[ParamName, ParamValue], Field(max_length=MAX_PARAMS)]
        | None
    ) = Field(
        default=None,
        description="Values DuckDB binds to the statement's parameters: a list for `$1`, `$2` (or `?`),"
        f" an object for `$name`; at most {MAX_PARAMS:,}, each a string (at most {MAX_PARAM_CHARS:,}"
        " characters), a number, a boolean or null",
    )
    after_commit: int | None = Field(
        default=None,
        ge=0,
        description=f"Read the normalized tables once they include this commit (a {SEEN_THROUGH_HEADER} an"
        " earlier answer gave) instead of every commit made before the statement",
    )


class QueryLimits(BaseModel):
    """What one query may take: time, result size, and how many run at once."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout_s: float = Field(10.0, gt=0)
    max_result_bytes: int = Field(256 * 1024 * 1024, ge=1)
    max_concurrent: int = Field(4, ge=1)


class QuerySlots:
    """The --query-concurrency slots every query path takes: /v1/query's and the web view's. A query waits
    for one at most QUEUE_WAIT_S, then is refused 429."""

    def __init__(self, limits: QueryLimits) -> None:
        self._limits = limits
        self._limiter = anyio.CapacityLimiter(limits.max_concurrent)

    async def acquire(self, holder: object) -> None:
        try:
            with anyio.fail_after(QUEUE_WAIT_S):
                await self._limiter.acquire_on_behalf_of(holder)
        except TimeoutError:
            raise HTTPException(
                429,
                f"too many queries: {self._limits.max_concurrent} are running (the server's"
                " --query-concurrency); retry shortly",
                headers={"Retry-After": "1"},
            ) from None

    def release(self, holder: object) -> None:
        self._limiter.release_on_behalf_of(holder)

    @contextmanager
    def held(self) -> Iterator[None]:
        """A slot for the block, from a worker thread of the event loop (a synchronous route's)."""
        holder = object()
        from_thread.run(self.acquire, holder)
        try:
            yield
        finally:
            from_thread.run_sync(self.release, holder)


class RunningQueries:
    """The queries running now, so that shutdown can stop them instead of waiting for them."""

    def __init__(self) -> None:
        # Touched by the event loop's thread only, and read by a signal handler running on that same thread.
        self._queries: set[UserQuery] = set()
        self.stopping = False

    def stop_all(self) -> None:
        """Interrupt every running query, and every later one (the server is stopping)."""
        self.stopping = True
        for query in list(self._queries):
            query.stop(QueryInterrupted("the server is shutting down; retry once it is back"))

    def add(self, query: UserQuery) -> None:
        if self.stopping:
            query.stop(QueryInterrupted("the server is shutting down; retry once it is back"))
        self._queries.add(query)

    def discard(self, query: UserQuery) -> None:
        self._queries.discard(query)


def arrow_stream_bytes(table: pa.Table) -> bytes:
    """A table as an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def json_bytes(table: pa.Table | pl.DataFrame) -> bytes:
    """A table as a JSON array of row objects; binary values (BLOB) as base64 strings, at any depth."""
    frame = table if isinstance(table, pl.DataFrame) else pl.from_arrow(table)
    frame = frame.with_columns(
        _base64(pl.col(name), dtype).alias(name) for name, dtype in frame.schema.items() if _has_binary(dtype)
    )
    return frame.write_json().encode()


def query_router(
    store: Store, auth: Auth, limits: QueryLimits, running: RunningQueries, slots: QuerySlots
) -> APIRouter:
    """The query endpoint (admin token only): a sandboxed statement (store/sandbox.py) within `limits`."""
    router = APIRouter(tags=["query"])

    @router.post(
        "/v1/query",
        summary="Run one read-only SQL statement over the store",
        dependencies=[Depends(admin_required(auth))],
        max_body_size=MAX_SQL_BYTES,
    )
    async def run_query(
        body: QueryIn, request: Request, accept: str | None = Header(default=None)
    ) -> Response:
        try:
            query = store.user_query(
                body.sql,
                max_result_bytes=limits.max_result_bytes,
                timeout_s=limits.timeout_s,
                after_commit=body.after_commit,
                params=body.params,
            )
        except ValueError as exc:  # ReadOnlyViolation, or an after_commit the store has not made
            raise HTTPException(400, f"query refused: {exc}") from None
        running.add(query)
        try:
            table = await _run(query, request, slots)
        except ReadOnlyViolation as exc:
            raise HTTPException(400, f"query refused: {exc}") from None
        except QueryFailed as exc:
            raise HTTPException(400, f"query failed: {exc}") from None
        except ResultTooLarge as exc:
            raise HTTPException(413, f"query refused: {exc}") from None
        except QueryTimeout as exc:
            raise HTTPException(408, f"query stopped: {exc}") from None
        except QueryInterrupted as exc:
            raise HTTPException(503, f"query stopped: {exc}", headers={"Retry-After": "1"}) from None
        finally:
            running.discard(query)
        seen = {SEEN_THROUGH_HEADER: str(store.seen_through())}
        if accept and "application/json" in accept:
            return Response(json_bytes(table), media_type="application/json", headers=seen)
        return Response(arrow_stream_bytes(table), media_type=ARROW_STREAM, headers=seen)

    return router


async def _run(query: UserQuery, request: Request, slots: QuerySlots) -> pa.Table:
    """Run the query in a worker thread once a slot is free, stopping it if its client goes away."""
    failure: Exception | None = None
    async with anyio.create_task_group() as watchers:
        watchers.start_soon(_stop_when_disconnected, request, query)
        try:
            table = await _in_slot(query, slots)
        except Exception as exc:  # raised below, outside the task group (which would wrap it in a group)
            failure = exc
        watchers.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return table


async def _in_slot(query: UserQuery, slots: QuerySlots) -> pa.Table:
    holder = object()
    await slots.acquire(holder)
    try:
        # A limiter of its own: the default one (40 threads) is the exports' and the gateway's.
        return await to_thread.run_sync(query.run, limiter=anyio.CapacityLimiter(1))
    finally:
        slots.release(holder)


async def _stop_when_disconnected(request: Request, query: UserQuery) -> None:
    while not await request.is_disconnected():
        await anyio.sleep(DISCONNECT_POLL_S)
    query.stop(QueryInterrupted("the client disconnected"))


def _has_binary(dtype: pl.DataType) -> bool:
    if dtype == pl.Binary:
        return True
    if isinstance(dtype, pl.List | pl.Array):
        return _has_binary(dtype.inner)
    if isinstance(dtype, pl.Struct):
        return any(_has_binary(field.dtype) for field in dtype.fields)
    return False


def _base64(expr: pl.Expr, dtype: pl.DataType) -> pl.Expr:
    """`expr` with every binary value inside it base64-encoded (polars writes no binary JSON)."""
    if dtype == pl.Binary:
        return expr.bin.encode("base64")
    if isinstance(dtype, pl.List):
        return expr.list.eval(_base64(pl.element(), dtype.inner))
    if isinstance(dtype, pl.Array):
        return expr.arr.eval(_base64(pl.element(), dtype.inner))
    if isinstance(dtype, pl.Struct):
        return pl.struct(_base64(expr.struct.field(f.name), f.dtype).alias(f.name) for f in dtype.fields)
    return expr
