"""uvicorn's HTTP protocol (httptools) held to the limits of otel_rl/connections.py.

A connection over a cap is answered 503 and closed as soon as it is accepted, before it costs more than the
moment's file descriptor; headers must arrive whole within a deadline and within a size, and a body must
keep arriving. A request fully received is never cut: the response that follows (the gateway's streams)
takes the time it takes.
"""

import asyncio
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from otel_rl.connections import CUT_REASON, ConnectionCounts

log = logging.getLogger(__name__)


def _response(status: str, message: str) -> bytes:
    body = message.encode()
    head = f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    if status.startswith("503"):
        head += "retry-after: 1\r\n"
    return head.encode() + f"content-length: {len(body)}\r\n\r\n".encode() + body


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the caps and read deadlines of a `ConnectionCounts`."""

    def __init__(self, *args, counts: ConnectionCounts, **kwargs) -> None:  # noqa: ANN002, ANN003 - uvicorn's
        super().__init__(*args, **kwargs)
        self._counts = counts
        self._address: str | None = None  # set once counted
        self._deadline: asyncio.TimerHandle | None = None
        self._header_bytes: int | None = (
            0  # bytes of the request being read before its headers ended; None after
        )

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = self.client[0] if self.client else "unknown"
        refused = self._counts.admit(address)
        if refused is not None:
            transport.write(_response("503 Service Unavailable", f"connection refused: {refused}\n"))
            transport.close()
            return
        self._address = address
        self._arm(self._counts.limits.header_timeout_s, "complete request headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._address is not None:
            self._counts.release(self._address)
            self._address = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # Counted once the parser has read the chunk, and only while the headers are still unfinished: a chunk
        # that ends them also carries the body's first bytes, which are no header (a 70 KB POST read at once
        # was answered 431).
        if self._header_bytes is not None and not self.transport.is_closing():
            self._header_bytes += len(data)
            if self._header_bytes > self._counts.limits.max_header_bytes:
                self._close(
                    "431 Request Header Fields Too Large",
                    f"the request line and headers are over {self._counts.limits.max_header_bytes} bytes",
                )

    # Parser callbacks (httptools calls them from inside data_received)
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        if self._deadline is None:  # a later request on a kept-alive connection: from its first byte
            self._arm(self._counts.limits.header_timeout_s, "complete request headers")

    def on_headers_complete(self) -> None:
        self._header_bytes = None
        self._arm(self._counts.limits.body_timeout_s, "request body bytes")
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._arm(self._counts.limits.body_timeout_s, "request body bytes")
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    # Deadlines
    def _arm(self, seconds: float, waiting_for: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired, seconds, waiting_for)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, seconds: float, waiting_for: str) -> None:
        self._deadline = None
        if self.flow is not None and self.flow.read_paused:  # the app is not reading: not the client's delay
            self._arm(seconds, waiting_for)
            return
        why = f"no {waiting_for} within {seconds:g} s"
        if self.cycle is None or self.cycle.response_complete or self._header_bytes is not None:
            log.warning("closed an HTTP connection from %s: %s", self._address, why)
            self._close("408 Request Timeout", why + "\n")
        else:  # the app has the request: it hears the disconnect (and logs it with this reason); a response
            # of ours would garble its own
            self.cycle.scope[CUT_REASON] = why
            self.transport.close()

    def _close(self, status: str, message: str) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(_response(status, message))
            self.transport.close()
