"""LiteLLM completion() with an add tool, the tool loop written by hand, traced by OpenInference.

The instrumentor uses the application's OTel SDK providers (litellm-otel has LiteLLM's own callback).
"""

import json
import os

import litellm
from _capture import MODEL, Ran, telemetry
from openinference.instrumentation.litellm import LiteLLMInstrumentor

FRAMEWORK = "LiteLLM"
INSTRUMENTATION = "openinference-instrumentation-litellm (OpenInference)"
REQUIREMENTS = [
    "litellm==1.110.2",
    "openinference-instrumentation-litellm==0.1.51",
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
shutdown = telemetry()
LiteLLMInstrumentor().instrument()


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
shutdown()
