"""Reading an HTTP request body no larger than a limit (the collector's exports, the gateway's calls)."""

import logging

from starlette.requests import ClientDisconnect, Request

from otel_rl.connections import CUT_REASON

log = logging.getLogger(__name__)


class BodyTooLarge(ValueError):
    """The body, compressed or decompressed, is over the configured limit (HTTP 413)."""


class ClientGone(ConnectionError):
    """The client's connection closed before its whole body arrived (it left, or was too slow to send it);
    logged here as one line: there is nobody to answer."""


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, refused before reading when Content-Length says it is too big, and while reading
    as soon as it passes the limit (a chunked body declares no length)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge(f"body of {declared} bytes is over the limit of {max_bytes} bytes")
    chunks = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise BodyTooLarge(f"body is over the limit of {max_bytes} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        client = request.client.host if request.client else "unknown"
        why = request.scope.get(CUT_REASON, "the client left")
        log.warning(
            "%s %s from %s: closed after %d body bytes: %s",
            request.method,
            request.url.path,
            client,
            size,
            why,
        )
        raise ClientGone(f"the connection closed after {size} body bytes: {why}") from None
    return b"".join(chunks)
