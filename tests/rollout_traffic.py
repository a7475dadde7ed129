"""Online training's traffic, made with the OpenTelemetry SDK: a controller's rollout span, gateway calls with
exact tokens (and optionally the harness's client call spans they supersede), an outcome reward."""

import numpy as np
from google.protobuf.message import Message
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from otel_rl import attributes as attr
from otel_rl.collector.rewards import RewardIn, reward_log_request


def rollout_requests(
    rollout_id: str, start_ns: int, *, with_client: bool = False, group_id: str = "g"
) -> list[Message]:
    """A controller rollout span, two gateway calls under it (exact tokens), optionally the harness's client
    call span around each (superseded by the gateway's), and an outcome reward as a log record."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    identity = {
        attr.ROLLOUT_ID: rollout_id,
        attr.ATTEMPT_ID: f"{rollout_id}-a",
        attr.GROUP_ID: group_id,
        attr.TASK_ID: "t",
        attr.SPLIT: "train",
    }
    root = provider.get_tracer(attr.CONTROLLER_SCOPE).start_span(
        attr.ROLLOUT_SPAN_NAME, start_time=start_ns, attributes={**identity, attr.ROLLOUT_STATUS: "ok"}
    )
    for turn in (1, 2):
        parent = trace.set_span_in_context(root)
        at = start_ns + turn * 10**6
        if with_client:
            client = provider.get_tracer("openai.client").start_span(
                "chat tiny", context=parent, start_time=at, attributes={"gen_ai.operation.name": "chat"}
            )
            parent = trace.set_span_in_context(client)
        call = provider.get_tracer(attr.GATEWAY_SCOPE).start_span(
            "chat tiny",
            context=parent,
            kind=SpanKind.CLIENT,
            start_time=at + 1000,
            attributes={
                **identity,
                "gen_ai.operation.name": "chat",
                attr.POLICY_VERSION: turn,
                attr.PROMPT_TOKEN_IDS: np.arange(4 * turn, dtype="<i4").tobytes(),
                attr.CHOICE_TOKEN_IDS.format(i=0): np.arange(3, dtype="<i4").tobytes(),
                attr.CHOICE_LOGPROBS.format(i=0): np.full(3, -0.5, dtype="<f4").tobytes(),
            },
        )
        call.end(end_time=at + 500_000)
        if with_client:
            client.end(end_time=at + 600_000)
    root.end(end_time=start_ns + 10**9)
    reward = RewardIn(rollout_id=rollout_id, name="outcome", value=1.0, source="test")
    return [
        encode_spans(exporter.get_finished_spans()),
        reward_log_request(reward, now_ns=start_ns + 2 * 10**9),
    ]
