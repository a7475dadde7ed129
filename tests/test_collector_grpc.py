"""OTLP/gRPC receiver: the real OTel gRPC exporters, large messages, and bad input."""

import os

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from test_collector_http import spans_request, stored_spans

TRACE_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def raw_trace_export(server, body: bytes, token: str | None) -> ExportTraceServiceResponse:
    """Send bytes as a TraceService/Export message (unparsed, so that they can be broken)."""
    options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
    with grpc.insecure_channel(server.grpc_target, options=options) as channel:
        export = channel.unary_unary(
            TRACE_EXPORT, request_serializer=None, response_deserializer=ExportTraceServiceResponse.FromString
        )
        metadata = [("authorization", f"Bearer {token}")] if token else []
        return export(body, metadata=metadata, timeout=60)


def test_the_real_otel_grpc_exporters_export_spans_and_logs(otel_rl_server) -> None:
    from opentelemetry._logs import LogRecord
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    headers = {"authorization": f"Bearer {otel_rl_server.token}"}
    target = f"http://{otel_rl_server.grpc_target}"
    tracer_provider = TracerProvider()
    span_exporter = OTLPSpanExporter(
        endpoint=target, insecure=True, headers=headers, compression=grpc.Compression.Gzip
    )
    tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(
        SimpleLogRecordProcessor(OTLPLogExporter(endpoint=target, insecure=True, headers=headers))
    )
    marker = os.urandom(8).hex()

    with tracer_provider.get_tracer("test").start_as_current_span("exported over grpc") as span:
        span.set_attribute("marker", marker)
        trace_id = format(span.get_span_context().trace_id, "032x")
    logger_provider.get_logger("test").emit(LogRecord(body=f"log {marker}", event_name="test.event"))
    tracer_provider.shutdown()
    logger_provider.shutdown()

    assert (
        otel_rl_server.scalar(f"SELECT name FROM spans WHERE trace_id = '{trace_id}'") == "exported over grpc"
    )
    assert (
        otel_rl_server.scalar(f"SELECT event_name FROM logs WHERE body->>'$' = 'log {marker}'")
        == "test.event"
    )


def test_a_message_far_above_grpcs_4_mib_default_is_accepted(otel_rl_server) -> None:
    request, trace_id = spans_request(3)
    request.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="big").value.string_value = "x" * (
        12 * 1024 * 1024
    )

    response = raw_trace_export(otel_rl_server, request.SerializeToString(), otel_rl_server.token)

    assert response == ExportTraceServiceResponse()
    assert stored_spans(otel_rl_server, trace_id) == 3


def test_a_repeated_grpc_export_is_stored_once(otel_rl_server) -> None:
    request, trace_id = spans_request(4)
    for _ in range(2):
        raw_trace_export(otel_rl_server, request.SerializeToString(), otel_rl_server.token)

    assert stored_spans(otel_rl_server, trace_id) == 4


@pytest.mark.parametrize(
    ("case", "token", "code", "message"),
    [
        ("truncated protobuf", "admin", grpc.StatusCode.INVALID_ARGUMENT, "could not be parsed"),
        ("valid", None, grpc.StatusCode.UNAUTHENTICATED, "missing bearer token"),
        ("valid", "wrong-token", grpc.StatusCode.UNAUTHENTICATED, "unknown bearer token"),
    ],
    ids=["truncated protobuf", "missing token", "wrong token"],
)
def test_bad_grpc_input_gets_its_status_and_stores_nothing(
    otel_rl_server, case, token, code, message
) -> None:
    request, trace_id = spans_request(3)
    body = request.SerializeToString()
    if case == "truncated protobuf":
        body = body[:-7]
    before = otel_rl_server.counts()

    with pytest.raises(grpc.RpcError) as refused:
        raw_trace_export(otel_rl_server, body, otel_rl_server.token if token == "admin" else token)

    assert refused.value.code() == code
    assert message in refused.value.details()
    assert otel_rl_server.counts() == before
