"""The anthropic client (2.x) with Traceloop's and OpenInference's anthropic instrumentations both on, as an
app that installs both gets it: each `messages.create` call is recorded twice, once by each. A tool loop
written by hand: a tool_use answer, the tool's result, the final text.
"""

import os

import anthropic
from _capture import MODEL, Ran, telemetry
from openinference.instrumentation.anthropic import AnthropicInstrumentor as OpenInferenceInstrumentor
from opentelemetry.instrumentation.anthropic import AnthropicInstrumentor as TraceloopInstrumentor

FRAMEWORK = "the anthropic client"
INSTRUMENTATION = "Traceloop's and OpenInference's anthropic instrumentations (both on)"
REQUIREMENTS = [
    "anthropic==2.17.0",
    "opentelemetry-instrumentation-anthropic==0.62.4",
    "openinference-instrumentation-anthropic==3.1.0",
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-exporter-otlp-proto-http==1.45.2",
]
ENVIRONMENT = {"TRACELOOP_TRACE_CONTENT": "true"}
REPLIES = [
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "toolu_add_1"}]},
    {"content": "2 + 3 = 5."},
]
TOOLS = [
    {
        "name": "add",
        "description": "Add two integers.",
        "input_schema": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    }
]

ran = Ran()
shutdown = telemetry()
TraceloopInstrumentor().instrument()
OpenInferenceInstrumentor().instrument()
client = anthropic.Anthropic(base_url=os.environ["ANTHROPIC_BASE_URL"], max_retries=0)


def add(a: int, b: int) -> int:
    return ran.tool("add", {"a": a, "b": b}, a + b)


messages = [{"role": "user", "content": "What is 2 + 3?"}]
first = client.messages.create(model=MODEL, max_tokens=256, messages=messages, tools=TOOLS)
messages.append({"role": "assistant", "content": [block.model_dump() for block in first.content]})
results = [
    {"type": "tool_result", "tool_use_id": block.id, "content": str(add(**block.input))}
    for block in first.content
    if block.type == "tool_use"
]
messages.append({"role": "user", "content": results})
final = client.messages.create(model=MODEL, max_tokens=256, messages=messages, tools=TOOLS)
print(final.content[0].text)
ran.write()
shutdown()
