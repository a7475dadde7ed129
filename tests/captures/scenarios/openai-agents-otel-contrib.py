"""OpenAI Agents SDK, contrib agents-v2: a Triage agent hands off to a Math agent (streamed): add(2, 3)."""

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
from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor

FRAMEWORK = "OpenAI Agents SDK"
INSTRUMENTATION = "opentelemetry-instrumentation-openai-agents-v2 (OpenTelemetry contrib)"
REQUIREMENTS = [
    "openai-agents==0.24.0",
    "opentelemetry-instrumentation-openai-agents-v2==0.1.0",
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-exporter-otlp-proto-http==1.45.2",
]
# content capture on, as the package documents it; gzip, which the OTLP exporters offer
ENVIRONMENT = {
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true",
    "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
}
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


async def main() -> None:
    math_agent = Agent(name="Math", instructions="Add numbers with the add tool.", tools=[add], model=MODEL)
    triage = Agent(
        name="Triage", instructions="Hand sums to the Math agent.", handoffs=[math_agent], model=MODEL
    )
    result = Runner.run_streamed(triage, "What is 2 + 3?", hooks=Agents())
    async for _ in result.stream_events():
        pass
    print(result.final_output)


asyncio.run(main())
ran.write()
shutdown()
