"""OTLP request bodies (protobuf or OTLP/JSON, plain, gzip or deflate) to OTLP request protos."""

import base64
import json
import zlib
from typing import Literal, TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError as ProtobufDecodeError
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from otel_rl.http_body import BodyTooLarge

Signal = Literal["traces", "logs", "metrics"]
Encoding = Literal["protobuf", "json"]
ExportRequest = ExportTraceServiceRequest | ExportLogsServiceRequest | ExportMetricsServiceRequest
ExportResponse = ExportTraceServiceResponse | ExportLogsServiceResponse | ExportMetricsServiceResponse
M = TypeVar("M", bound=Message)

REQUEST_TYPES: dict[Signal, type[ExportRequest]] = {
    "traces": ExportTraceServiceRequest,
    "logs": ExportLogsServiceRequest,
    "metrics": ExportMetricsServiceRequest,
}
RESPONSE_TYPES: dict[Signal, type[ExportResponse]] = {
    "traces": ExportTraceServiceResponse,
    "logs": ExportLogsServiceResponse,
    "metrics": ExportMetricsServiceResponse,
}
CONTENT_TYPES: dict[str, Encoding] = {
    "application/x-protobuf": "protobuf",
    "application/protobuf": "protobuf",
    "application/json": "json",
}
# OTLP/JSON writes these ids as hex (the proto3 JSON mapping would use base64): byte lengths by key.
_ID_BYTES = {"traceId": 16, "spanId": 8, "parentSpanId": 8}
# JSON objects and arrays inside each other. Protobuf's JSON parser stops at 100 nested messages, about 130
# JSON levels for OTLP; deeper documents are refused here before Python's recursion limit is reached.
MAX_JSON_DEPTH = 256


class DecodeError(ValueError):
    """The body could not be decoded; the message names what failed (HTTP 400, gRPC INVALID_ARGUMENT)."""


class UnsupportedContentType(ValueError):
    """The Content-Type or Content-Encoding is not one OTLP uses (HTTP 415)."""


def encoding_of(content_type: str | None) -> Encoding:
    """The OTLP encoding named by a Content-Type header (parameters such as charset are ignored)."""
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type not in CONTENT_TYPES:
        raise UnsupportedContentType(
            f"unsupported content type {content_type or '(none)'!r}: "
            "send application/x-protobuf or application/json"
        )
    return CONTENT_TYPES[media_type]


def decompress(body: bytes, content_encoding: str | None, *, max_bytes: int) -> bytes:
    """The body with its Content-Encoding (identity, gzip, deflate) undone, refusing more than max_bytes."""
    coding = (content_encoding or "identity").strip().lower()
    if coding in ("", "identity"):
        return body
    if coding in ("gzip", "x-gzip"):
        return _inflate(body, wbits=31, max_bytes=max_bytes, what="gzip")
    if coding == "deflate":
        # The OTel exporters send zlib-wrapped deflate (RFC 1950); some clients send it raw (RFC 1951).
        try:
            return _inflate(body, wbits=15, max_bytes=max_bytes, what="deflate")
        except DecodeError:
            return _inflate(body, wbits=-15, max_bytes=max_bytes, what="deflate")
    raise UnsupportedContentType(f"unsupported content encoding {content_encoding!r}: use gzip or deflate")


def _inflate(body: bytes, *, wbits: int, max_bytes: int, what: str) -> bytes:
    out = bytearray()
    data = body
    # A gzip body may hold several members back to back; each needs its own decompressor.
    while data:
        inflater = zlib.decompressobj(wbits)
        try:
            out += inflater.decompress(data, max_bytes + 1 - len(out))
        except zlib.error as exc:
            raise DecodeError(f"{what} body is corrupt: {exc}") from None
        if len(out) > max_bytes or inflater.unconsumed_tail:
            raise BodyTooLarge(f"decompressed {what} body is over the limit of {max_bytes} bytes")
        if not inflater.eof:
            raise DecodeError(f"{what} body is truncated (the compressed stream does not end)")
        data = inflater.unused_data
    return bytes(out)


def parse_request(signal: Signal, payload: bytes, encoding: Encoding) -> ExportRequest:
    """The Export*ServiceRequest of a signal from its decompressed body."""
    request_type = REQUEST_TYPES[signal]
    if encoding == "protobuf":
        return parse_protobuf(request_type, payload)
    return parse_otlp_json(request_type, payload)


def parse_protobuf(message_type: type[M], payload: bytes) -> M:
    """A protobuf message from its wire bytes, or a DecodeError naming the message type."""
    try:
        return message_type.FromString(payload)
    except ProtobufDecodeError as exc:
        # upb's own words ("Exceeded upb_DecodeOptions_MaxDepth") do not say what a sender can change
        reason = "messages nested over protobuf's limit of 100 levels" if "MaxDepth" in str(exc) else exc
        raise DecodeError(f"protobuf {message_type.__name__} could not be parsed: {reason}") from None


def parse_otlp_json(message_type: type[M], payload: bytes) -> M:
    """A message from OTLP/JSON: lowerCamelCase keys, hex ids, int64 as strings, integer enums."""
    too_deep = DecodeError(
        f"OTLP/JSON body nests objects and arrays over the limit of {MAX_JSON_DEPTH} levels"
    )
    try:
        document = json.loads(payload)
    except UnicodeDecodeError as exc:
        raise DecodeError(f"JSON body is not UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise DecodeError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:  # the json module recurses once per level, up to Python's recursion limit
        raise too_deep from None
    if not isinstance(document, dict):
        raise DecodeError(f"OTLP/JSON {message_type.__name__} must be a JSON object")
    if not _hex_ids_to_base64(document):
        raise too_deep
    try:
        return json_format.ParseDict(document, message_type(), ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise DecodeError(f"OTLP/JSON {message_type.__name__} could not be parsed: {exc}") from None


def _hex_ids_to_base64(document: dict) -> bool:
    """Rewrite hex trace/span ids in place to the base64 that protobuf's JSON parser reads; False (and
    stop) when the document nests over MAX_JSON_DEPTH levels. A loop, not a recursion: any depth is safe."""
    pending: list[tuple[dict | list, int]] = [(document, 1)]
    while pending:
        node, depth = pending.pop()
        if depth > MAX_JSON_DEPTH:
            return False
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _ID_BYTES and isinstance(value, str):
                    node[key] = _id_to_base64(key, value)
                elif isinstance(value, dict | list):
                    pending.append((value, depth + 1))
        else:
            pending.extend((item, depth + 1) for item in node if isinstance(item, dict | list))
    return True


def _id_to_base64(key: str, value: str) -> str:
    if len(value) == 2 * _ID_BYTES[key] or value == "":
        try:
            return base64.b64encode(bytes.fromhex(value)).decode("ascii")
        except ValueError:
            raise DecodeError(f"OTLP/JSON {key} {value!r} is not hex") from None
    # Not the hex length: let the proto3 JSON mapping (base64) have a go, and fail there if it is bad.
    return value


def encode_response(response: Message, encoding: Encoding) -> tuple[bytes, str]:
    """An Export*ServiceResponse in the request's encoding, with its Content-Type."""
    if encoding == "protobuf":
        return response.SerializeToString(), "application/x-protobuf"
    text = json_format.MessageToJson(response, indent=None, preserving_proto_field_name=False)
    return text.encode(), "application/json"
