"""An OTLP/HTTP receiver that saves every export request byte for byte, as tests/captures/ keeps them."""

from __future__ import annotations

import base64
import json
import socket
import threading
from pathlib import Path
from typing import Any

import uvicorn
from google.protobuf import json_format
from loopback import ThreadedServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from otel_rl.collector.decode import (
    RESPONSE_TYPES,
    BodyTooLarge,
    DecodeError,
    ExportRequest,
    Signal,
    UnsupportedContentType,
    decompress,
    encode_response,
    encoding_of,
    parse_request,
)

# Far above any capture (the SDK exporters batch 512 spans): a runaway client gets 413, not all the memory.
MAX_BODY_BYTES = 64 << 20
SIGNALS: dict[str, Signal] = {"/v1/traces": "traces", "/v1/logs": "logs", "/v1/metrics": "metrics"}
ID_KEYS = ("traceId", "spanId", "parentSpanId")


def otlp_json(request: ExportRequest) -> dict[str, Any]:
    """The request in OTLP/JSON (lowerCamelCase keys, integer enums, hex trace and span ids), as
    tests/captures/ keeps beside each body and otel_rl.collector.decode.parse_otlp_json reads back."""
    document = json_format.MessageToDict(request, use_integers_for_enums=True)
    pending: list[Any] = [document]
    while pending:  # protobuf's JSON mapping writes ids in base64; OTLP/JSON writes them in hex
        node = pending.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ID_KEYS and isinstance(value, str):
                    node[key] = base64.b64decode(value).hex()
                elif isinstance(value, dict | list):
                    pending.append(value)
        elif isinstance(node, list):
            pending.extend(node)
    return document


def body_suffix(content_type: str | None, content_encoding: str | None) -> str:
    """The file suffix of a body: `bin` or `json` by its encoding, `.gz` / `.deflate` when compressed."""
    suffix = "json" if encoding_of(content_type) == "json" else "bin"
    coding = (content_encoding or "identity").strip().lower()
    if coding in ("gzip", "x-gzip"):
        return f"{suffix}.gz"
    if coding == "deflate":
        return f"{suffix}.deflate"
    return suffix


class OTLPReceiver:
    """Answers POST /v1/traces, /v1/logs and /v1/metrics on 127.0.0.1 with the OTLP success body and saves
    each request into `folder` as NN_<signal>.<bin|json>[.gz] (NN: arrival order, from 01), with
    NN_<signal>.meta.json (path, headers, content type and encoding) and NN_<signal>.decoded.json (OTLP/JSON).
    A body that does not decode is answered 400 and kept in `.errors`, so that a capture run can fail loudly.

        with OTLPReceiver(folder) as receiver:
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
    """

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.saved: list[Path] = []  # the body files, in arrival order
        self.errors: list[str] = []
        self.port = 0
        self._lock = threading.Lock()
        self._serving: ThreadedServer | None = None

    @property
    def endpoint(self) -> str:
        """The OTLP/HTTP base endpoint (the exporters append /v1/<signal>)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OTLPReceiver:
        self.folder.mkdir(parents=True, exist_ok=True)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        app = Starlette(routes=[Route(path, self._export, methods=["POST"]) for path in SIGNALS])
        config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
        self._serving = ThreadedServer(config, sock, what="OTLP receiver").start()
        return self

    def stop(self) -> None:
        if self._serving is not None:
            self._serving.stop()
            self._serving = None

    def __enter__(self) -> OTLPReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _export(self, request: Request) -> Response:
        signal = SIGNALS[request.url.path]
        content_type = request.headers.get("content-type")
        content_encoding = request.headers.get("content-encoding")
        try:
            body = await _read_bounded(request)
            encoding = encoding_of(content_type)
            suffix = body_suffix(content_type, content_encoding)
            decoded = parse_request(
                signal, decompress(body, content_encoding, max_bytes=MAX_BODY_BYTES), encoding
            )
        except BodyTooLarge as exc:
            return self._refuse(413, f"{signal}: {exc}")
        except UnsupportedContentType as exc:
            return self._refuse(415, f"{signal}: {exc}")
        except DecodeError as exc:
            return self._refuse(400, f"{signal}: {exc}")
        meta = {
            "signal": signal,
            "method": request.method,
            "path": request.url.path,
            "http_version": request.scope.get("http_version"),
            "headers": dict(request.headers),
            "content_type": content_type,
            "content_encoding": content_encoding,
            "content_length": len(body),
            "answered_status": 200,
        }
        with self._lock:  # numbers follow arrival order even when exporters post at the same time
            number = len(self.saved) + 1
            stem = self.folder / f"{number:02d}_{signal}"
            body_path = stem.with_name(f"{stem.name}.{suffix}")
            body_path.write_bytes(body)
            stem.with_name(f"{stem.name}.meta.json").write_text(json.dumps({"seq": number} | meta, indent=2))
            decoded_text = json.dumps(otlp_json(decoded), indent=2, ensure_ascii=False)
            stem.with_name(f"{stem.name}.decoded.json").write_text(decoded_text + "\n")
            self.saved.append(body_path)
        content, response_type = encode_response(RESPONSE_TYPES[signal](), encoding)
        return Response(content, media_type=response_type)

    def _refuse(self, status: int, message: str) -> Response:
        self.errors.append(message)
        return Response(json.dumps({"code": 3, "message": message}), status_code=status,
                        media_type="application/json")  # fmt: skip


async def _read_bounded(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise BodyTooLarge(f"Content-Length {declared} is over the limit of {MAX_BODY_BYTES} bytes")
    chunks = bytearray()
    async for chunk in request.stream():  # chunked bodies carry no length: count as they come
        chunks += chunk
        if len(chunks) > MAX_BODY_BYTES:
            raise BodyTooLarge(f"body is over the limit of {MAX_BODY_BYTES} bytes")
    return bytes(chunks)
