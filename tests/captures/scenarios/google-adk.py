"""A Google ADK LlmAgent on LiteLlm("openai/...") calls `add` once, then answers; ADK's own OTel tracing."""

import asyncio
import os

from _capture import MODEL, Ran, telemetry
from google.adk.agents import LlmAgent
from google.adk.models.lite_llm import LiteLlm
from google.adk.runners import InMemoryRunner
from google.genai import types

FRAMEWORK = "Google ADK"
INSTRUMENTATION = "ADK built-in OpenTelemetry tracing"
REQUIREMENTS = [
    "google-adk==2.13.0",
    "litellm==1.110.2",
    # google-adk 2.13.0 requires opentelemetry-api and -sdk <=1.44
    "opentelemetry-sdk==1.44.0",
    "opentelemetry-exporter-otlp-proto-http==1.44.0",
]
# ADK records messages only when the OTel GenAI content switch says so (`true` means EVENT_ONLY): here on the
# inference span and its log event both. LiteLLM would fetch its price list online: use its own copy.
ENVIRONMENT = {
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_AND_EVENT",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}
REPLIES = [
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_add_1"}]},
    {"content": "2 + 3 = 5."},
]

AGENT = "calculator"
USER = "user"
shutdown = telemetry()
ran = Ran()


def add(a: int, b: int) -> int:
    """Add two integers."""
    return ran.tool("add", {"a": a, "b": b}, a + b)


model = LiteLlm(
    model=f"openai/{MODEL}", api_base=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"]
)
agent = LlmAgent(name=AGENT, model=model, instruction="Add numbers with the add tool.", tools=[add])


async def main() -> None:
    runner = InMemoryRunner(agent=agent, app_name="capture")
    session = await runner.session_service.create_session(app_name="capture", user_id=USER)
    question = types.Content(role="user", parts=[types.Part(text="What is 2 + 3? Use the add tool.")])
    async for event in runner.run_async(user_id=USER, session_id=session.id, new_message=question):
        if event.is_final_response():
            print(event.content.parts[0].text)


ran.agent(AGENT)
asyncio.run(main())
shutdown()
ran.write()
