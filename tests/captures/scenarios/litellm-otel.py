"""LiteLLM completion() with an add tool, the tool loop written by hand, traced by its own OTel callback.

`litellm.callbacks = ["otel"]` is all the code: the callback makes its tracer provider from the standard
OTEL_EXPORTER_OTLP_* variables (or takes the application's, when one is set).
"""

import json
import os

import litellm
from _capture import MODEL, Ran
from opentelemetry import trace

FRAMEWORK = "LiteLLM"
INSTRUMENTATION = 'built in: litellm.callbacks = ["otel"] (LiteLLM)'
REQUIREMENTS = [
    "litellm==1.110.2",
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-exporter-otlp-proto-http==1.45.2",
]
ENVIRONMENT = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # the cost map from the package, not fetched online
REPLIES = [
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_add_1"}]},
    {"content": "2 + 3 = 5."},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]

ran = Ran()
litellm.callbacks = ["otel"]


def add(a: int, b: int) -> int:
    return ran.tool("add", {"a": a, "b": b}, a + b)


def complete(messages: list[dict]) -> litellm.ModelResponse:
    # "openai/<model>" with api_base: LiteLLM's route to any OpenAI-compatible server
    return litellm.completion(
        model=f"openai/{MODEL}", api_base=os.environ["OPENAI_BASE_URL"], messages=messages, tools=TOOLS
    )


messages = [{"role": "user", "content": "What is 2 + 3?"}]
first = complete(messages).choices[0].message
messages.append(first.model_dump(exclude_none=True))
for call in first.tool_calls:
    result = add(**json.loads(call.function.arguments))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
print(complete(messages).choices[0].message.content)
ran.write()
trace.get_tracer_provider().shutdown()  # the callback's provider: flushes the spans
