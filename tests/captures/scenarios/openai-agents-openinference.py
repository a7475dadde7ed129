"""OpenAI Agents SDK, OpenInference: a Triage agent hands off to a Math agent, which calls add(2, 3)."""

import asyncio

from _capture import MODEL, Ran, telemetry
from agents import (
    Agent,
    RunContextWrapper,
    RunHooks,
    Runner,
    function_tool,
    set_default_openai_api,
    set_trace_processors,
)
from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

FRAMEWORK = "OpenAI Agents SDK"
INSTRUMENTATION = "openinference-instrumentation-openai-agents (OpenInference)"
REQUIREMENTS = [
    "openai-agents==0.24.0",
    "openinference-instrumentation-openai-agents==2.6.0",
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-exporter-otlp-proto-http==1.45.2",
]
ENVIRONMENT = {}  # OpenInference records content unless OPENINFERENCE_HIDE_* says otherwise
REPLIES = [
    {"tool_calls": [{"name": "transfer_to_math", "arguments": {}, "id": "call_handoff_1"}]},
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_add_1"}]},
    {"content": "2 + 3 = 5."},
]

ran = Ran()
shutdown = telemetry()
set_default_openai_api("chat_completions")  # the scripted server speaks Chat Completions, not Responses
set_trace_processors([])  # drops the SDK's exporter to OpenAI's servers (set_tracing_disabled would silence
# the instrumentation too: it turns off the SDK's traces, not one processor); the instrumentation adds its own
OpenAIAgentsInstrumentor().instrument()


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return ran.tool("add", {"a": a, "b": b}, a + b)


class Agents(RunHooks):
    async def on_agent_start(self, context: RunContextWrapper, agent: Agent) -> None:
        ran.agent(agent.name)


math_agent = Agent(name="Math", instructions="Add numbers with the add tool.", tools=[add], model=MODEL)
triage = Agent(name="Triage", instructions="Hand sums to the Math agent.", handoffs=[math_agent], model=MODEL)
result = asyncio.run(Runner.run(triage, "What is 2 + 3?", hooks=Agents()))
print(result.final_output)
ran.write()
shutdown()
