"""Reading an HTTP request body no larger than a limit (the collector's exports, the gateway's calls)."""

from starlette.requests import Request


class BodyTooLarge(ValueError):
    """The body, compressed or decompressed, is over the configured limit (HTTP 413)."""


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, refused before reading when Content-Length says it is too big, and while reading
    as soon as it passes the limit (a chunked body declares no length)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge(f"body of {declared} bytes is over the limit of {max_bytes} bytes")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLarge(f"body is over the limit of {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
