"""A Haystack Agent with an add tool over OpenAIChatGenerator, traced by Haystack's own OpenTelemetry tracer,
which speaks only its `haystack.*` attributes: a `haystack.agent.run` span around one `haystack.component.run`
span per component run (`chat_generator`, `tool_invoker`), content in `haystack.component.input` / `.output`.
"""

import os

from _capture import MODEL, Ran, telemetry
from haystack import tracing
from haystack.components.agents import Agent
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.dataclasses import ChatMessage
from haystack.tools import Tool
from haystack.tracing.opentelemetry import OpenTelemetryTracer
from haystack.utils import Secret
from opentelemetry import trace

FRAMEWORK = "Haystack"
INSTRUMENTATION = "built in: haystack.tracing with its OpenTelemetryTracer (haystack.* attributes)"
REQUIREMENTS = [
    "haystack-ai==2.31.0",
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-exporter-otlp-proto-http==1.45.2",
]
ENVIRONMENT = {"HAYSTACK_CONTENT_TRACING_ENABLED": "true", "HAYSTACK_TELEMETRY_ENABLED": "False"}
REPLIES = [
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_add_1"}]},
    {"content": "2 + 3 = 5."},
]

ran = Ran()
shutdown = telemetry()
tracing.enable_tracing(OpenTelemetryTracer(trace.get_tracer("haystack")))


def add(a: int, b: int) -> int:
    return ran.tool("add", {"a": a, "b": b}, a + b)


tool = Tool(
    name="add",
    description="Add two integers.",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
    function=add,
)
generator = OpenAIChatGenerator(
    model=MODEL, api_base_url=os.environ["OPENAI_BASE_URL"], api_key=Secret.from_env_var("OPENAI_API_KEY")
)
agent = Agent(chat_generator=generator, tools=[tool], system_prompt="Add numbers with the add tool.")
agent.warm_up()
result = agent.run(messages=[ChatMessage.from_user("What is 2 + 3?")])
print(result["messages"][-1].text)
ran.write()
shutdown()
