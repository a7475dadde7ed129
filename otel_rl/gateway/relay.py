"""A streamed call's events on the way to the client: as vLLM sent them, stripped, or in a protocol's form."""

from typing import Any

import orjson

from otel_rl.gateway.errors import error_body
from otel_rl.gateway.outputs import StreamAssembler
from otel_rl.gateway.protocols import ProtocolStream
from otel_rl.gateway.upstream import ClientAsked, strip_response


def relay_events(
    payloads: list[str],
    assembler: StreamAssembler,
    asked: ClientAsked,
    data: bytes,
    stream: ProtocolStream | None,
) -> bytes:
    """Feed a received piece of the stream to the assembler; the bytes to pass on to the client."""
    chunks = [orjson.loads(payload) if payload != "[DONE]" else None for payload in payloads]
    for chunk in chunks:
        if chunk is None:
            assembler.finished = True
        else:
            assembler.add(chunk)
    if stream is not None:
        translated = b""
        for chunk in chunks:
            if chunk is not None and isinstance(chunk.get("error"), dict):
                raise StreamFailed(chunk["error"], translated)
            translated += stream.finish() if chunk is None else stream.feed(chunk)
        return translated
    if asked.everything:
        return data
    # By hand, as messages_stream._event says why: orjson's one-line JSON makes the event these bytes.
    return b"".join(
        b"data: [DONE]\n\n"
        if chunk is None
        else b"data: " + orjson.dumps(strip_response(chunk, asked)) + b"\n\n"
        for chunk in chunks
    )


class StreamFailed(Exception):
    """vLLM's error event mid-stream (`data: {"error": {...}}`, then `[DONE]`), and the protocol's events
    translated before it in the same read."""

    def __init__(self, error: dict[str, Any], translated: bytes) -> None:
        super().__init__(str(error.get("message")))
        self.status = error["code"] if isinstance(error.get("code"), int) else 500
        self.error_type = str(error.get("type") or "APIError")
        self.translated = translated


def sse_error(status: int, message: str, error_type: str) -> bytes:
    """An error event: the official client raises it as an APIError mid-stream."""
    return b"data: " + error_body(status, message, error_type) + b"\n\n"
