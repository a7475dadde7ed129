"""OpenAI Agents SDK, Logfire: one Math agent, streamed, calls add(2, 3) and answers.

Logfire sends nothing to its own service (`send_to_logfire=False`): it exports through the standard
OTEL_EXPORTER_OTLP_* variables, as its docs describe for other backends.
"""

import asyncio

import logfire
from _capture import MODEL, Ran
from agents import (
    Agent,
    RunContextWrapper,
    RunHooks,
    Runner,
    function_tool,
    set_default_openai_api,
    set_trace_processors,
)

FRAMEWORK = "OpenAI Agents SDK"
INSTRUMENTATION = "logfire.instrument_openai_agents() (Logfire)"
REQUIREMENTS = [
    "openai-agents==0.24.0",
    "logfire==5.4.0",
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-exporter-otlp-proto-http==1.45.2",
]
ENVIRONMENT = {}  # Logfire records message content by default
REPLIES = [
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_add_1"}]},
    {"content": "2 + 3 = 5."},
]

ran = Ran()
logfire.configure(send_to_logfire=False, console=False)
set_default_openai_api("chat_completions")  # the scripted server speaks Chat Completions, not Responses
set_trace_processors([])  # drops the SDK's exporter to OpenAI's servers (set_tracing_disabled would silence
# Logfire too: it turns off the SDK's traces, not one processor)
logfire.instrument_openai_agents()


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return ran.tool("add", {"a": a, "b": b}, a + b)


class Agents(RunHooks):
    async def on_agent_start(self, context: RunContextWrapper, agent: Agent) -> None:
        ran.agent(agent.name)


async def main() -> None:
    agent = Agent(name="Math", instructions="Add numbers with the add tool.", tools=[add], model=MODEL)
    result = Runner.run_streamed(agent, "What is 2 + 3?", hooks=Agents())
    async for _ in result.stream_events():
        pass
    print(result.final_output)


asyncio.run(main())
ran.write()
logfire.shutdown()
