"""A LlamaIndex FunctionAgent on OpenAILike calls `add` once, then answers; OpenInference traces it."""

import asyncio
import os

from _capture import MODEL, Ran, telemetry
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai_like import OpenAILike
from openinference.instrumentation.llama_index import LlamaIndexInstrumentor

FRAMEWORK = "LlamaIndex"
INSTRUMENTATION = "OpenInference openinference-instrumentation-llama-index"
REQUIREMENTS = [
    "llama-index-core==0.14.25",
    "llama-index-llms-openai-like==0.8.1",
    "openinference-instrumentation-llama-index==4.6.1",
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-exporter-otlp-proto-http==1.45.2",
]
ENVIRONMENT = {}  # OpenInference records content unless OPENINFERENCE_HIDE_* says otherwise
REPLIES = [
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call_add_1"}]},
    {"content": "2 + 3 = 5."},
]

AGENT = "calculator"
shutdown = telemetry()
LlamaIndexInstrumentor().instrument()
ran = Ran()


def add(a: int, b: int) -> int:
    """Add two integers."""
    return ran.tool("add", {"a": a, "b": b}, a + b)


llm = OpenAILike(
    model=MODEL,
    api_base=os.environ["OPENAI_BASE_URL"],
    api_key=os.environ["OPENAI_API_KEY"],
    is_chat_model=True,
    is_function_calling_model=True,
    temperature=0,
)
agent = FunctionAgent(
    name=AGENT, description="Adds numbers.", tools=[FunctionTool.from_defaults(add)], llm=llm
)


async def main() -> None:
    # the workflow runtime schedules its steps on the running loop: run() must be called inside one
    print(await agent.run(user_msg="What is 2 + 3? Use the add tool."))


ran.agent(AGENT)
asyncio.run(main())
shutdown()
ran.write()
