"""OTLP/gRPC receiver: the Trace, Logs and Metrics services, with the OTLP/HTTP receiver's semantics."""

import logging
import time
from collections.abc import Callable
from concurrent import futures

import grpc
from google.protobuf.duration_pb2 import Duration
from google.rpc.error_details_pb2 import RetryInfo

from otel_rl.auth import Auth, Unauthorized
from otel_rl.collector.decode import REQUEST_TYPES, DecodeError, Signal, parse_protobuf
from otel_rl.collector.export import prepare_export
from otel_rl.collector.ingest_metrics import IngestMetrics
from otel_rl.connections import ConnectionLimits, descriptor_budget
from otel_rl.store import Saturated, Store
from otel_rl.store.writer import StoreUnavailable

log = logging.getLogger(__name__)

# Far above gRPC's 4 MiB default: the OTel exporters send batches of up to 64 MiB.
MAX_MESSAGE_BYTES = 80 * 1024 * 1024
# Exports running or queued for a worker at once; more are refused RESOURCE_EXHAUSTED, which exporters retry.
MAX_CONCURRENT_RPCS = 128
_SERVICES: dict[Signal, str] = {
    "traces": "opentelemetry.proto.collector.trace.v1.TraceService",
    "logs": "opentelemetry.proto.collector.logs.v1.LogsService",
    "metrics": "opentelemetry.proto.collector.metrics.v1.MetricsService",
}


def start_grpc_server(
    store: Store,
    auth: Auth,
    metrics: IngestMetrics,
    *,
    host: str,
    port: int,
    workers: int = 8,
    limits: ConnectionLimits | None = None,
) -> tuple[grpc.Server, int]:
    """Start the OTLP/gRPC services on host:port (0 picks a free port), each export counted in `metrics`;
    returns the server and its port. `limits`: its connections at once (within a quarter of the open-file
    limit) and how long a client may take to open its HTTP/2 session."""
    limits = limits or ConnectionLimits()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="otel-rl-grpc"),
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_allowed_incoming_connections", descriptor_budget(limits.max_connections, share=4)),
            ("grpc.server_handshake_timeout_ms", round(limits.header_timeout_s * 1000)),
        ],
        maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
    )
    for signal, service in _SERVICES.items():
        handler = grpc.unary_unary_rpc_method_handler(
            _export_handler(store, auth, metrics, signal),
            # Raw bytes in: parsed here, a bad message gets INVALID_ARGUMENT and a clear text.
            request_deserializer=None,
            response_serializer=lambda response: response.SerializeToString(),
        )
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, {"Export": handler})])
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"could not bind the OTLP/gRPC port {host}:{port}")
    server.start()
    return server, bound


def _export_handler(store: Store, auth: Auth, metrics: IngestMetrics, signal: Signal) -> Callable:
    request_type = REQUEST_TYPES[signal]

    def export(payload: bytes, context: grpc.ServicerContext):  # noqa: ANN202 - the signal's response type
        started = time.perf_counter()
        try:
            try:
                principal = auth.authenticate(dict(context.invocation_metadata()).get("authorization"))
                request = parse_protobuf(request_type, payload)
                prepared = prepare_export(store, signal, request, principal)
                store.submit(prepared.batch).result()
            except Exception as exc:
                metrics.refused(signal, "grpc", exc, body_bytes=len(payload))
                raise
        except Unauthorized as exc:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        except DecodeError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Saturated as exc:
            _abort_retryable(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc), exc.retry_after)
        except StoreUnavailable as exc:  # a full disk, an I/O error, or shutting down: retried
            _abort_retryable(context, grpc.StatusCode.UNAVAILABLE, str(exc), exc.retry_after)
        except Exception as exc:
            log.exception("OTLP/gRPC export failed")
            context.abort(
                grpc.StatusCode.INTERNAL, f"the export could not be stored: {type(exc).__name__}: {exc}"
            )
        metrics.stored(
            signal, "grpc", prepared, body_bytes=len(payload), seconds=time.perf_counter() - started
        )
        return prepared.response

    return export


def _abort_retryable(
    context: grpc.ServicerContext, code: grpc.StatusCode, message: str, delay: float
) -> None:
    """Abort with RetryInfo in the trailers: the OTel exporters wait that long before retrying."""
    seconds = int(delay)
    retry = RetryInfo(retry_delay=Duration(seconds=seconds, nanos=int((delay - seconds) * 1e9)))
    context.set_trailing_metadata((("google.rpc.retryinfo-bin", retry.SerializeToString()),))
    context.abort(code, message)
