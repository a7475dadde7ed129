"""Decoding OTLP bodies: encodings, compressions and the errors that name what failed."""

import base64
import gzip
import json

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from otel_rl.collector.decode import (
    BodyTooLarge,
    DecodeError,
    UnsupportedContentType,
    decompress,
    encode_response,
    encoding_of,
    parse_request,
)

SPAN_JSON = {
    "resourceSpans": [{"scopeSpans": [{"spans": [{"name": "s", "kind": 3, "startTimeUnixNano": "17"}]}]}]
}


def test_content_types_are_read_without_their_parameters() -> None:
    assert encoding_of("application/json; charset=utf-8") == "json"
    assert encoding_of("Application/X-Protobuf") == "protobuf"
    with pytest.raises(UnsupportedContentType, match="'text/plain'"):
        encoding_of("text/plain")
    with pytest.raises(UnsupportedContentType, match=r"\(none\)"):
        encoding_of(None)


def test_concatenated_gzip_members_are_all_decompressed() -> None:
    assert decompress(gzip.compress(b"abc") + gzip.compress(b"def"), "gzip", max_bytes=100) == b"abcdef"


def test_decompression_stops_at_the_limit() -> None:
    with pytest.raises(BodyTooLarge, match="over the limit of 1000 bytes"):
        decompress(gzip.compress(b"a" * 1001), "gzip", max_bytes=1000)


def test_otlp_json_ids_may_be_hex_or_base64() -> None:
    document = json.loads(json.dumps(SPAN_JSON))
    span = document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["traceId"] = "5b8efff798038103d269b633813fc60c"
    span["spanId"] = base64.b64encode(bytes.fromhex("eee19b7ec3c1b174")).decode()

    parsed = parse_request("traces", json.dumps(document).encode(), "json")

    span = parsed.resource_spans[0].scope_spans[0].spans[0]
    assert span.trace_id.hex() == "5b8efff798038103d269b633813fc60c"
    assert span.span_id.hex() == "eee19b7ec3c1b174"
    assert span.kind == 3 and span.start_time_unix_nano == 17


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[1, 2]", "must be a JSON object"),
        (b'{"a": "\xc3\x28"}', "JSON body is not UTF-8"),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "soon"}]}]}]}',
            "could not be parsed",
        ),
    ],
)
def test_json_that_is_not_an_otlp_request_is_refused_with_the_reason(body: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        parse_request("traces", body, "json")


def test_a_partial_success_is_answered_in_the_requests_encoding() -> None:
    response = ExportTraceServiceResponse()
    response.partial_success.rejected_spans = 2
    response.partial_success.error_message = "2 rejected"

    as_json, json_type = encode_response(response, "json")
    as_protobuf, protobuf_type = encode_response(response, "protobuf")

    assert json.loads(as_json) == {"partialSuccess": {"rejectedSpans": "2", "errorMessage": "2 rejected"}}
    assert json_type == "application/json" and protobuf_type == "application/x-protobuf"
    assert ExportTraceServiceResponse.FromString(as_protobuf) == response
