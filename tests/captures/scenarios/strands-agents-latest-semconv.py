"""A Strands agent on its OpenAI model provider calls `add` once, then answers; latest GenAI conventions."""

import _strands_calculator
from _capture import Ran

FRAMEWORK = "Strands Agents"
INSTRUMENTATION = "Strands built-in OpenTelemetry tracing (StrandsTelemetry), latest GenAI conventions"
REQUIREMENTS = [
    "strands-agents[openai]==1.62.0",
    # strands-agents needs opentelemetry-instrumentation-threading, whose newest (0.66b1) pins the 1.45.1 API
    "opentelemetry-sdk==1.45.1",
    "opentelemetry-exporter-otlp-proto-http==1.45.1",
]
# the opt-in Strands reads to write gen_ai.input.messages / output.messages instead of span events
ENVIRONMENT = {"OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental"}
REPLIES = [
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_add_1"}]},
    {"content": "2 + 3 = 5."},
]

ran = Ran()
print(_strands_calculator.run(ran))
ran.write()
