"""A LangGraph graph (model node + ToolNode) calls `add` once, then answers; Traceloop traces it."""

import _langgraph_calculator
from _capture import Ran, telemetry
from opentelemetry.instrumentation.langchain import LangchainInstrumentor

FRAMEWORK = "LangGraph"
INSTRUMENTATION = "Traceloop opentelemetry-instrumentation-langchain"
REQUIREMENTS = [
    "langgraph==1.2.24",
    "langchain-openai==1.7.4",
    "opentelemetry-instrumentation-langchain==0.62.4",
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-exporter-otlp-proto-http==1.45.2",
]
ENVIRONMENT = {"TRACELOOP_TRACE_CONTENT": "true"}
REPLIES = [
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_add_1"}]},
    {"content": "2 + 3 = 5."},
]

shutdown = telemetry()
LangchainInstrumentor().instrument()
ran = Ran()
print(_langgraph_calculator.run(ran))
ran.write()
shutdown()
