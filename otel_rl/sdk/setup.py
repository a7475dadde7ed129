"""`otel_rl.instrument()`: OTLP traces and logs, the OpenAI instrumentation, and trace propagation."""

import contextlib
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import import_module, metadata
from pathlib import Path

from opentelemetry import context, trace
from opentelemetry._logs import get_logger_provider, set_logger_provider
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
from opentelemetry.propagate import extract
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.util.re import parse_env_headers

from otel_rl.sdk.propagation import RolloutIdentityProcessor, environment_carrier, propagate_over_http

log = logging.getLogger(__name__)

TOKEN_FILE = Path(".otel_rl") / "token"  # written by `otel-rl serve` when it makes its own token

# The OpenAI instrumentations otel-rl reads, by module, in the order instrument() prefers them: Arize
# OpenInference, the official OpenTelemetry one, Traceloop/OpenLLMetry. It turns on one, as two would record
# every call twice; Traceloop comes with otel-rl, so one that the user installed wins over it.
OPENAI_INSTRUMENTATIONS = (
    "openinference.instrumentation.openai",
    "opentelemetry.instrumentation.openai_v2",
    "opentelemetry.instrumentation.openai",
)


@dataclass(frozen=True)
class Telemetry:
    """What `instrument()` set up. The SDK flushes and shuts its providers down at exit by itself."""

    tracer_provider: TracerProvider
    logger_provider: LoggerProvider
    # the OpenAI instrumentation modules recording calls: one, unless opentelemetry-instrument turned on more
    instrumentations: tuple[str, ...]

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        spans = self.tracer_provider.force_flush(timeout_millis)
        return self.logger_provider.force_flush(timeout_millis) and spans

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.logger_provider.shutdown()


_telemetry: Telemetry | None = None


def instrument(endpoint: str | None = None, service_name: str | None = None) -> Telemetry:
    """Send this process's traces and logs to otel-rl over OTLP and record its OpenAI calls. Idempotent.

    `endpoint` is the server's base URL (`http://127.0.0.1:4318`); without it the standard
    `OTEL_EXPORTER_OTLP_*` variables apply (`http/protobuf` unless `OTEL_EXPORTER_OTLP_PROTOCOL=grpc`).
    The token comes from `OTEL_EXPORTER_OTLP_HEADERS`, else `OTEL_RL_TOKEN`, else `.otel_rl/token`.
    A global TracerProvider / LoggerProvider that is already set up is kept: instrument() adds the
    rollout-identity processor to it, and exporters only when `endpoint` is given.
    """
    global _telemetry
    if _telemetry is not None:
        return _telemetry
    resource = Resource.create({SERVICE_NAME: service_name or default_service_name()})
    tracer_provider, logger_provider = configured_providers(resource, endpoint)
    tracer_provider.add_span_processor(RolloutIdentityProcessor())
    join_environment_trace()
    propagate_over_http()
    _telemetry = Telemetry(tracer_provider, logger_provider, instrument_openai())
    return _telemetry


def default_service_name() -> str:
    return os.environ.get("OTEL_SERVICE_NAME") or Path(sys.argv[0]).stem or "unknown_service"


def configured_providers(resource: Resource, endpoint: str | None) -> tuple[TracerProvider, LoggerProvider]:
    """The global providers, created with OTLP exporters unless they exist already."""
    tracer_provider = trace.get_tracer_provider()
    logger_provider = get_logger_provider()
    new_tracing = not isinstance(tracer_provider, TracerProvider)
    new_logging = not isinstance(logger_provider, LoggerProvider)
    if new_tracing:
        tracer_provider = TracerProvider(resource=resource)
        trace.set_tracer_provider(tracer_provider)
    if new_logging:
        logger_provider = LoggerProvider(resource=resource)
        set_logger_provider(logger_provider)
    # A provider that was set up before exports where its owner said; add otel-rl only when asked to.
    if new_tracing or endpoint:
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter(endpoint)))
    if new_logging or endpoint:
        logger_provider.add_log_record_processor(BatchLogRecordProcessor(log_exporter(endpoint)))
    return tracer_provider, logger_provider


def otlp_protocol() -> str:
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    if protocol not in ("http/protobuf", "grpc"):
        raise ValueError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not supported: use http/protobuf or grpc"
        )
    return protocol


def span_exporter(endpoint: str | None) -> SpanExporter:
    """An OTLP span exporter to `endpoint` (a base URL), else where the OTEL_* variables say."""
    headers = exporter_headers(os.environ)
    if otlp_protocol() == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint, headers=headers)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(f"{endpoint.rstrip('/')}/v1/traces" if endpoint else None, headers=headers)


def log_exporter(endpoint: str | None) -> LogRecordExporter:
    """An OTLP log exporter, like span_exporter()."""
    headers = exporter_headers(os.environ)
    if otlp_protocol() == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcExporter

        return GrpcExporter(endpoint, headers=headers)
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

    return OTLPLogExporter(f"{endpoint.rstrip('/')}/v1/logs" if endpoint else None, headers=headers)


def exporter_headers(environ: Mapping[str, str], token_file: Path = TOKEN_FILE) -> dict[str, str] | None:
    """Headers for the exporters. None lets them read OTEL_EXPORTER_OTLP_HEADERS themselves; when those
    carry no `authorization`, add `Bearer <token>` from OTEL_RL_TOKEN or OTEL_RL_TOKEN_FILE, else from the
    local server's token file (as `otel-rl sql` does)."""
    from otel_rl.auth import read_token_file, token_from_environment

    headers = parse_env_headers(environ.get("OTEL_EXPORTER_OTLP_HEADERS", ""), liberal=True)
    if "authorization" in headers:
        return None
    found = token_from_environment(environ)
    token = found[0] if found else (read_token_file(token_file) if token_file.is_file() else None)
    return headers | {"authorization": f"Bearer {token}"} if token else None


def join_environment_trace() -> None:
    """A process started with TRACEPARENT / BAGGAGE in its environment (by the rollout controller or by
    `Rollout.env()`) continues that trace: make it this thread's context."""
    carrier = environment_carrier(os.environ)
    if carrier and not trace.get_current_span().get_span_context().is_valid:
        context.attach(extract(carrier))


def installed_openai_instrumentors() -> list[tuple[str, BaseInstrumentor]]:
    """(module, instrumentor) of every OpenAI instrumentation that imports here, in order of preference."""
    installed = []
    for module_name in OPENAI_INSTRUMENTATIONS:
        # openai-v2 2.4b0 fails to import with opentelemetry-util-genai >= 1.2 (a module it uses moved)
        with contextlib.suppress(ImportError):
            installed.append((module_name, import_module(module_name).OpenAIInstrumentor()))
    return installed


def instrument_openai() -> tuple[str, ...]:
    """Turn on the preferred OpenAI instrumentation that works here, with message content captured; none
    when one is on already (`opentelemetry-instrument` turns on every one installed)."""
    installed = installed_openai_instrumentors()
    already_on = tuple(name for name, tool in installed if tool.is_instrumented_by_opentelemetry)
    if already_on:
        return already_on
    for module_name, instrumentor in installed:
        if module_name.endswith("openai_v2"):
            os.environ.setdefault("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", v2_content_setting())
        try:
            instrumentor.instrument()
        except ImportError as exc:  # openai-v2 2.4b0 imports `httpx`, which openai>=3 no longer installs
            log.warning("otel-rl: %s is installed but does not work here (%s); skipped", module_name, exc)
            continue
        return (module_name,)
    return ()


def warm_up() -> None:
    """Import everything `instrument()` imports, setting nothing up: a fork server (the rollout controller's
    `preload`) calls this once so that each harness it forks instruments itself in milliseconds. The
    instrumentations import most of their modules only inside `instrument()`, hence the round trip."""
    span_exporter(None)
    log_exporter(None)
    for module_name in ("httpx", "httpx2"):  # what propagate_over_http() patches
        with contextlib.suppress(ImportError):
            import_module(module_name)
    for _, instrumentor in installed_openai_instrumentors():  # the one instrument_openai() would turn on
        try:
            instrumentor.instrument()
        except ImportError:
            continue
        instrumentor.uninstrument()
        break


def v2_content_setting() -> str:
    """The official instrumentation's content switch: a mode on its latest-semconv path (util-genai >= 1.0,
    or opted in), a boolean on its legacy path."""
    try:
        major = int(metadata.version("opentelemetry-util-genai").split(".")[0])
    except metadata.PackageNotFoundError:
        major = 0
    latest = major >= 1 or "gen_ai_latest_experimental" in os.environ.get("OTEL_SEMCONV_STABILITY_OPT_IN", "")
    return "span_only" if latest else "true"
