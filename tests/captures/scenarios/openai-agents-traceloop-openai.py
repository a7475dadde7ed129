"""OpenAI Agents SDK, Traceloop's agents and openai instrumentations both on: each model call is seen twice.

As `Traceloop.init()` does for an app with both packages: the agents instrumentation's `openai.response`
span (the request only: Traceloop 0.62.4 reads output from Responses-API spans alone) and, inside it, the
openai client's `openai.chat` span with the output, usage and finish reason of the same call.
"""

import asyncio

from _capture import MODEL, Ran, telemetry
from agents import Agent, RunContextWrapper, RunHooks, Runner, function_tool, set_default_openai_api
from opentelemetry.instrumentation.openai import OpenAIInstrumentor
from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor

FRAMEWORK = "OpenAI Agents SDK"
INSTRUMENTATION = (
    "opentelemetry-instrumentation-openai-agents + opentelemetry-instrumentation-openai (Traceloop)"
)
REQUIREMENTS = [
    "openai-agents==0.24.0",
    "opentelemetry-instrumentation-openai-agents==0.62.4",
    "opentelemetry-instrumentation-openai==0.62.4",
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-exporter-otlp-proto-http==1.45.2",
]
ENVIRONMENT = {"TRACELOOP_TRACE_CONTENT": "true"}
REPLIES = [
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_add_1"}]},
    {"content": "2 + 3 = 5."},
]

ran = Ran()
shutdown = telemetry()
set_default_openai_api("chat_completions")  # the scripted server speaks Chat Completions, not Responses
# replace_existing_processors drops the SDK's exporter to OpenAI's servers (set_tracing_disabled would
# silence the instrumentation too: it turns off the SDK's traces, not one processor)
OpenAIAgentsInstrumentor(replace_existing_processors=True).instrument()
OpenAIInstrumentor().instrument()


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return ran.tool("add", {"a": a, "b": b}, a + b)


class Agents(RunHooks):
    async def on_agent_start(self, context: RunContextWrapper, agent: Agent) -> None:
        ran.agent(agent.name)


agent = Agent(name="Math", instructions="Add numbers with the add tool.", tools=[add], model=MODEL)
result = asyncio.run(Runner.run(agent, "What is 2 + 3?", hooks=Agents()))
print(result.final_output)
ran.write()
shutdown()
