"""What the scenario scripts share: OTel SDK providers exporting OTLP/HTTP, and the report of what ran."""

import json
import os
from collections.abc import Callable
from typing import Any

from opentelemetry import _logs, metrics, trace
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

MODEL = os.environ["CAPTURE_MODEL"]


def telemetry() -> Callable[[], None]:
    """Global tracer, logger and meter providers exporting OTLP/HTTP as a user's app sets them up (endpoint
    and resource from the standard OTEL_* variables); returns the shutdown that flushes them all."""
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(tracer_provider)
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter()))
    _logs.set_logger_provider(logger_provider)
    meter_provider = MeterProvider([PeriodicExportingMetricReader(OTLPMetricExporter())])
    metrics.set_meter_provider(meter_provider)

    def shutdown() -> None:
        tracer_provider.shutdown()
        logger_provider.shutdown()
        meter_provider.shutdown()

    return shutdown


class Ran:
    """The tools and agents the framework ran, written to CAPTURE_REPORT for the driver's expected.json."""

    def __init__(self) -> None:
        self.tools: list[dict[str, Any]] = []
        self.agents: list[str] = []

    def tool(self, name: str, arguments: dict[str, Any], result: Any) -> Any:
        self.tools.append({"name": name, "arguments": arguments, "result": result})
        return result

    def agent(self, name: str) -> None:
        if name not in self.agents:
            self.agents.append(name)

    def write(self) -> None:
        with open(os.environ["CAPTURE_REPORT"], "w") as f:
            json.dump({"tools": self.tools, "agents": self.agents}, f)
