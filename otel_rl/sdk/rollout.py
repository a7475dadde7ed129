"""`otel_rl.rollout()` and `otel_rl.reward()`: the rollout's span, its identity in baggage, and rewards."""

import math
import numbers
import os
import uuid
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from time import time_ns
from urllib.parse import unquote

from opentelemetry import baggage, context, propagate, trace
from opentelemetry._logs import get_logger_provider
from opentelemetry.context import Context
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext

from otel_rl import attributes as attr
from otel_rl.sdk.propagation import LAST_LLM_CALL, baggage_identity, context_environment, environment_carrier


def resource_identity(environ: Mapping[str, str]) -> dict[str, str]:
    """The rollout identity in OTEL_RESOURCE_ATTRIBUTES (`key=value,...`, values percent-encoded)."""
    pairs = (
        item.split("=", 1) for item in environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",") if "=" in item
    )
    return {key.strip(): unquote(value.strip()) for key, value in pairs if key.strip() in attr.IDENTITY_KEYS}


def parent_context(environ: Mapping[str, str]) -> Context:
    """The current context if a span is active, else the trace this process was started in (environment)."""
    if trace.get_current_span().get_span_context().is_valid:
        return context.get_current()
    return propagate.extract(environment_carrier(environ))


def resolve_identity(
    given: Mapping[str, str | None], parent: Context, environ: Mapping[str, str]
) -> dict[str, str]:
    """Explicit values, else the parent's baggage, else OTEL_RESOURCE_ATTRIBUTES; a new rollout id if none."""
    identity = resource_identity(environ) | baggage_identity(parent)
    identity |= {key: value for key, value in given.items() if value is not None}
    identity.setdefault(attr.ROLLOUT_ID, uuid.uuid4().hex)
    identity.setdefault(attr.SPLIT, "train")
    return identity


@dataclass(frozen=True)
class Rollout:
    """An open rollout: its identity, its span, and what a harness does with them."""

    identity: Mapping[str, str]
    span: Span
    context: Context  # the rollout's span and baggage

    @property
    def rollout_id(self) -> str:
        return self.identity[attr.ROLLOUT_ID]

    @property
    def last_call(self) -> SpanContext | None:
        """The last model call made in this thread or task (target it with `reward(..., span=...)`)."""
        return LAST_LLM_CALL.get()

    def env(self) -> dict[str, str]:
        """TRACEPARENT and BAGGAGE for a child process: its `otel_rl.rollout()` joins this rollout."""
        return context_environment(self.context)

    def reward(
        self,
        value: float,
        name: str = "outcome",
        *,
        label: str | None = None,
        explanation: str | None = None,
        source: str = "harness",
        span: Span | SpanContext | None = None,
    ) -> None:
        """Record a reward for this rollout (default: parented to the rollout span, an outcome reward)."""
        target = span if span is not None else self.span
        emit_reward(value, name, label, explanation, source, target, self.identity)


@contextmanager
def rollout(
    *,
    task_id: str | None = None,
    group_id: str | None = None,
    split: str | None = None,
    rollout_id: str | None = None,
    attempt_id: str | None = None,
) -> Iterator[Rollout]:
    """Open the rollout's span and carry its identity, in baggage, to every span, outgoing request and child
    process inside the block. Started by the rollout controller (or from `Rollout.env()`), it joins the
    parent's trace and takes the identity it was given; an exception marks the span ERROR."""
    parent = parent_context(os.environ)
    given = {attr.TASK_ID: task_id, attr.GROUP_ID: group_id, attr.SPLIT: split,
             attr.ROLLOUT_ID: rollout_id, attr.ATTEMPT_ID: attempt_id}  # fmt: skip
    identity = resolve_identity(given, parent, os.environ)
    for key, value in identity.items():
        parent = baggage.set_baggage(key, value, parent)
    token = context.attach(parent)
    no_call_yet = LAST_LLM_CALL.set(None)
    try:
        tracer = trace.get_tracer(attr.SDK_SCOPE)
        with tracer.start_as_current_span(attr.SDK_ROLLOUT_SPAN_NAME, attributes=identity) as span:
            yield Rollout(identity, span, context.get_current())
    finally:
        LAST_LLM_CALL.reset(no_call_yet)
        context.detach(token)


def reward(
    value: float,
    name: str = "outcome",
    *,
    label: str | None = None,
    explanation: str | None = None,
    source: str = "harness",
    span: Span | SpanContext | None = None,
) -> None:
    """Record a reward: one `gen_ai.evaluation.result` event (an OTel log record) parented to `span`,
    by default the current span — the rollout's span inside `with otel_rl.rollout()` (an outcome reward).
    Parent it to a model call's span (`span=r.last_call`) for a turn reward."""
    target = span if span is not None else trace.get_current_span()
    emit_reward(value, name, label, explanation, source, target, baggage_identity())


def emit_reward(
    value: float,
    name: str,
    label: str | None,
    explanation: str | None,
    source: str,
    target: Span | SpanContext,
    identity: Mapping[str, str],
) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"reward {name!r}: value must be a finite number, got {value!r}")
    span_context = target.get_span_context() if isinstance(target, Span) else target
    if not span_context.is_valid:
        raise ValueError(
            f"reward {name!r}: no span to attach it to (call it inside `with otel_rl.rollout()`)"
        )
    provider = get_logger_provider()
    if not isinstance(provider, LoggerProvider):
        warnings.warn(
            "otel_rl.reward: no OpenTelemetry LoggerProvider is set up, so the reward is dropped; "
            "call otel_rl.instrument() first",
            stacklevel=3,
        )
    optional = {attr.EVALUATION_SCORE_LABEL: label, attr.EVALUATION_EXPLANATION: explanation}
    attributes = {
        attr.EVALUATION_NAME: name,
        attr.EVALUATION_SCORE_VALUE: float(value),
        attr.REWARD_SOURCE: source,
        **{key: text for key, text in optional.items() if text is not None},
        **identity,
    }
    provider.get_logger(attr.SDK_SCOPE).emit(
        timestamp=time_ns(),
        context=trace.set_span_in_context(NonRecordingSpan(span_context)),
        event_name=attr.EVALUATION_EVENT,
        attributes=attributes,
    )
