"""The LangGraph agent, OpenInference on LangChain and on the openai client: each model call is seen twice."""

import _langgraph_calculator
from _capture import Ran, telemetry
from openinference.instrumentation.langchain import LangChainInstrumentor
from openinference.instrumentation.openai import OpenAIInstrumentor

FRAMEWORK = "LangGraph"
INSTRUMENTATION = "OpenInference langchain + openai instrumentations (both on)"
REQUIREMENTS = [
    "langgraph==1.2.24",
    "langchain-openai==1.7.4",
    "openinference-instrumentation-langchain==0.1.80",
    "openinference-instrumentation-openai==0.1.66",
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-exporter-otlp-proto-http==1.45.2",
]
ENVIRONMENT = {}  # OpenInference records content unless OPENINFERENCE_HIDE_* says otherwise
REPLIES = [
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_add_1"}]},
    {"content": "2 + 3 = 5."},
]

shutdown = telemetry()
# both, as users do who trace their own openai calls too. OpenInference's LangChain tracer never attaches its
# spans to the context (on purpose: callbacks may not end them), so each openai client span is the root of a
# trace of its own, beside the ChatOpenAI span of the same call.
LangChainInstrumentor().instrument()
OpenAIInstrumentor().instrument()
ran = Ran()
print(_langgraph_calculator.run(ran))
ran.write()
shutdown()
