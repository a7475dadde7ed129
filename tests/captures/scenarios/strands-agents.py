"""A Strands agent on its OpenAI model provider calls `add` once, then answers; Strands' own OTel tracing."""

import _strands_calculator
from _capture import Ran

FRAMEWORK = "Strands Agents"
INSTRUMENTATION = "Strands built-in OpenTelemetry tracing (StrandsTelemetry), default conventions"
REQUIREMENTS = [
    "strands-agents[openai]==1.62.0",
    # strands-agents needs opentelemetry-instrumentation-threading, whose newest (0.66b1) pins the 1.45.1 API
    "opentelemetry-sdk==1.45.1",
    "opentelemetry-exporter-otlp-proto-http==1.45.1",
]
ENVIRONMENT = {}  # Strands records messages as gen_ai.* span events by default
REPLIES = [
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_add_1"}]},
    {"content": "2 + 3 = 5."},
]

ran = Ran()
print(_strands_calculator.run(ran))
ran.write()
