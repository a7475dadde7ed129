"""A LangGraph graph (model node + ToolNode) calls `add` once, then answers; OpenInference traces it."""

import _langgraph_calculator
from _capture import Ran, telemetry
from openinference.instrumentation.langchain import LangChainInstrumentor

FRAMEWORK = "LangGraph"
INSTRUMENTATION = "OpenInference openinference-instrumentation-langchain"
REQUIREMENTS = [
    "langgraph==1.2.24",
    "langchain-openai==1.7.4",
    "openinference-instrumentation-langchain==0.1.80",
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-exporter-otlp-proto-http==1.45.2",
]
ENVIRONMENT = {}  # OpenInference records content unless OPENINFERENCE_HIDE_* says otherwise
REPLIES = [
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_add_1"}]},
    {"content": "2 + 3 = 5."},
]

shutdown = telemetry()
LangChainInstrumentor().instrument()
ran = Ran()
print(_langgraph_calculator.run(ran))
ran.write()
shutdown()
