"""Pydantic AI with its built-in OpenTelemetry instrumentation: one agent calls add(2, 3) and answers."""

from _capture import MODEL, Ran, telemetry
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

FRAMEWORK = "Pydantic AI"
INSTRUMENTATION = "built in: Agent.instrument_all() (OpenTelemetry GenAI conventions)"
REQUIREMENTS = [
    "pydantic-ai-slim[openai]==2.68.0",
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-exporter-otlp-proto-http==1.45.2",
]
ENVIRONMENT = {}  # InstrumentationSettings records content by default (include_content=True)
REPLIES = [
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_add_1"}]},
    {"content": "2 + 3 = 5."},
]

ran = Ran()
shutdown = telemetry()
# OpenAIChatModel: Chat Completions (the scripted server's API); the provider reads OPENAI_BASE_URL/API_KEY
model = OpenAIChatModel(MODEL, provider=OpenAIProvider())
Agent.instrument_all()  # every agent: spans through the global tracer provider (no Logfire needed)
agent = Agent(model, name="Math", instructions="Add numbers with the add tool.")


@agent.tool_plain
def add(a: int, b: int) -> int:
    """Add two integers."""
    return ran.tool("add", {"a": a, "b": b}, a + b)


ran.agent(agent.name)
result = agent.run_sync("What is 2 + 3?")
print(result.output)
ran.write()
shutdown()
