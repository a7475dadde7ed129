"""A CrewAI crew (one agent, task and tool) calls `add` once, then answers; OpenInference traces it."""

import os

from _capture import MODEL, Ran, telemetry
from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool
from openinference.instrumentation.crewai import CrewAIInstrumentor
from openinference.instrumentation.openai import OpenAIInstrumentor

FRAMEWORK = "CrewAI"
INSTRUMENTATION = "OpenInference openinference-instrumentation-crewai + openinference-instrumentation-openai"
REQUIREMENTS = [
    "crewai==1.15.30",
    "openinference-instrumentation-crewai==1.1.21",
    # CrewAI 1.x calls "openai/..." models through its native provider on the openai client, not LiteLLM
    "openinference-instrumentation-openai==0.1.66",
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-exporter-otlp-proto-http==1.45.2",
]
# CrewAI's own telemetry (its private TracerProvider, to CrewAI's servers) and its hosted tracing off: only
# crewai_core.telemetry reads CREWAI_DISABLE_TELEMETRY, while OTEL_SDK_DISABLED would switch off ours too
ENVIRONMENT = {"CREWAI_DISABLE_TELEMETRY": "true", "CREWAI_TRACING_ENABLED": "false"}
REPLIES = [
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_add_1"}]},
    {"content": "2 + 3 = 5."},
]

AGENT = "Calculator"
shutdown = telemetry()
CrewAIInstrumentor().instrument()
OpenAIInstrumentor().instrument()  # OpenInference's CrewAI guide pairs the two for the LLM spans
ran = Ran()


@tool("add")
def add(a: int, b: int) -> int:
    """Add two integers."""
    return ran.tool("add", {"a": a, "b": b}, a + b)


llm = LLM(
    model=f"openai/{MODEL}", base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"]
)
agent = Agent(
    role=AGENT, goal="Add numbers with the add tool.", backstory="A careful calculator.", tools=[add], llm=llm
)
task = Task(description="What is 2 + 3? Use the add tool.", expected_output="The sum.", agent=agent)
ran.agent(AGENT)
print(Crew(agents=[agent], tasks=[task]).kickoff())
shutdown()
ran.write()
