"""OTLP/HTTP receiver: POST /v1/traces, /v1/logs, /v1/metrics (protobuf or JSON; gzip or deflate)."""

import asyncio
import logging
import time
from dataclasses import dataclass

from anyio import CapacityLimiter, to_thread
from fastapi import APIRouter, Request, Response
from google.protobuf.duration_pb2 import Duration
from google.rpc import code_pb2, status_pb2
from google.rpc.error_details_pb2 import RetryInfo

from otel_rl.auth import Auth, Unauthorized
from otel_rl.collector.decode import (
    DecodeError,
    Encoding,
    Signal,
    UnsupportedContentType,
    decompress,
    encode_response,
    encoding_of,
    parse_request,
)
from otel_rl.collector.export import PreparedExport, prepare_export
from otel_rl.collector.ingest_metrics import IngestMetrics
from otel_rl.http_body import BodyTooLarge, ClientGone, read_body
from otel_rl.store import Saturated, Store
from otel_rl.store.writer import StoreUnavailable

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
# google.rpc.Code of each error status, for the Status body that OTLP/HTTP error replies carry.
_RPC_CODES = {
    400: code_pb2.INVALID_ARGUMENT,
    401: code_pb2.UNAUTHENTICATED,
    413: code_pb2.RESOURCE_EXHAUSTED,
    415: code_pb2.INVALID_ARGUMENT,
    429: code_pb2.RESOURCE_EXHAUSTED,
    500: code_pb2.INTERNAL,
    503: code_pb2.UNAVAILABLE,
}


@dataclass(frozen=True)
class HTTPFailure:
    """How an export ends when it fails: an HTTP error status and a message for the sender."""

    status: int
    message: str
    retry_after: float | None = None


def collector_router(
    store: Store, auth: Auth, metrics: IngestMetrics, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
) -> APIRouter:
    """The OTLP/HTTP routes, writing to `store`, accepting the admin token or a rollout key; each export
    counted in `metrics`."""
    router = APIRouter(tags=["OTLP"])
    # Decoding holds the GIL: two at once only add thread switches (5% more CPU per span, measured).
    decoding = CapacityLimiter(1)

    async def export(request: Request, signal: Signal) -> Response:
        encoding: Encoding = "json"  # errors found before the content type is known are answered in JSON
        started, body = time.perf_counter(), b""
        try:
            principal = auth.authenticate(request.headers.get("authorization"))
            encoding = encoding_of(request.headers.get("content-type"))
            body = await read_body(request, max_body_bytes)
            content_encoding = request.headers.get("content-encoding")

            def decode_and_flatten() -> PreparedExport:
                payload = decompress(body, content_encoding, max_bytes=max_body_bytes)
                return prepare_export(store, signal, parse_request(signal, payload, encoding), principal)

            # Off the event loop: a large request takes a while to decode, and the loop keeps serving.
            prepared = await to_thread.run_sync(decode_and_flatten, limiter=decoding)
            await asyncio.wrap_future(store.submit(prepared.batch))
        except Exception as exc:
            metrics.refused(signal, "http", exc, body_bytes=len(body))
            return _error_response(_as_failure(exc), encoding)
        metrics.stored(signal, "http", prepared, body_bytes=len(body), seconds=time.perf_counter() - started)
        content, media_type = encode_response(prepared.response, encoding)
        return Response(content, media_type=media_type)

    @router.post("/v1/traces", summary="OTLP/HTTP trace export")
    async def export_traces(request: Request) -> Response:
        return await export(request, "traces")

    @router.post("/v1/logs", summary="OTLP/HTTP log export")
    async def export_logs(request: Request) -> Response:
        return await export(request, "logs")

    @router.post("/v1/metrics", summary="OTLP/HTTP metric export")
    async def export_metrics(request: Request) -> Response:
        return await export(request, "metrics")

    return router


def _as_failure(exc: Exception) -> HTTPFailure:
    """The status an export error maps to (only 429/502/503/504 make OTel exporters retry)."""
    if isinstance(exc, Unauthorized):
        return HTTPFailure(401, str(exc))
    if isinstance(exc, UnsupportedContentType):
        return HTTPFailure(415, str(exc))
    if isinstance(exc, BodyTooLarge):
        return HTTPFailure(413, str(exc))
    if isinstance(exc, ClientGone):  # logged by read_body; the answer reaches nobody
        return HTTPFailure(400, str(exc))
    if isinstance(exc, DecodeError):
        return HTTPFailure(400, str(exc))
    if isinstance(exc, Saturated):
        return HTTPFailure(429, str(exc), retry_after=exc.retry_after)
    if isinstance(exc, StoreUnavailable):  # a full disk, an I/O error, or shutting down: retried
        return HTTPFailure(503, str(exc), retry_after=exc.retry_after)
    log.exception("OTLP export failed")
    return HTTPFailure(500, f"the export could not be stored: {type(exc).__name__}: {exc}")


def _error_response(failure: HTTPFailure, encoding: Encoding) -> Response:
    """An OTLP error reply: a google.rpc.Status in the request's encoding."""
    status = status_pb2.Status(code=_RPC_CODES.get(failure.status, code_pb2.UNKNOWN), message=failure.message)
    headers = {}
    if failure.retry_after is not None:
        seconds = max(1, round(failure.retry_after))
        headers["Retry-After"] = str(seconds)
        # The delay in the body too, as gRPC carries it (OTLP's Status details): either is read by exporters.
        status.details.add().Pack(RetryInfo(retry_delay=Duration(seconds=seconds)))
    content, media_type = encode_response(status, encoding)
    return Response(content, status_code=failure.status, media_type=media_type, headers=headers)
