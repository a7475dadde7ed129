"""The Strands agent both Strands scenarios run, with Strands' own telemetry setup (StrandsTelemetry)."""

import os

from _capture import MODEL, Ran
from strands import Agent, tool
from strands.models.openai import OpenAIModel
from strands.telemetry import StrandsTelemetry

AGENT = "calculator"


def run(ran: Ran) -> str:
    """Set up Strands' OTLP exporters, ask the agent for 2 + 3, flush the providers and return its answer."""
    telemetry = StrandsTelemetry().setup_otlp_exporter().setup_meter(enable_otlp_exporter=True)

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return ran.tool("add", {"a": a, "b": b}, a + b)

    model = OpenAIModel(
        client_args={"base_url": os.environ["OPENAI_BASE_URL"], "api_key": os.environ["OPENAI_API_KEY"]},
        model_id=MODEL,
        params={"temperature": 0},
    )
    agent = Agent(name=AGENT, model=model, tools=[add], callback_handler=None)
    ran.agent(AGENT)
    answer = str(agent("What is 2 + 3? Use the add tool."))
    telemetry.tracer_provider.shutdown()
    telemetry.meter_provider.shutdown()
    return answer
