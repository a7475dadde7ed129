"""Carry the rollout identity: baggage → span attributes, trace context → HTTP headers and child processes."""

import inspect
from collections.abc import Mapping
from contextvars import ContextVar
from importlib import import_module
from typing import Any

from opentelemetry import baggage, propagate
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanContext

from otel_rl.attributes import IDENTITY_KEYS

# The span context of the last model call that ended in this thread or task (for turn rewards).
LAST_LLM_CALL: ContextVar[SpanContext | None] = ContextVar("otel_rl_last_llm_call", default=None)
# The model-call operations of GenAI semconv (and its older `completion`), and Traceloop's request types:
# the views recognize the same (transforms/18_call_spans.sql).
LLM_OPERATIONS = ("chat", "text_completion", "generate_content", "completion")


def baggage_identity(context: Context | None = None) -> dict[str, str]:
    """The rollout identity carried in a context's W3C baggage."""
    return {key: str(value) for key, value in baggage.get_all(context).items() if key in IDENTITY_KEYS}


def is_llm_call(attributes: Mapping[str, Any]) -> bool:
    """Whether a span records a model call, in any of the instrumentations' dialects."""
    return (
        attributes.get("gen_ai.operation.name") in LLM_OPERATIONS
        or attributes.get("openinference.span.kind") == "LLM"
        or attributes.get("llm.request.type") in ("chat", "completion")
    )


class RolloutIdentityProcessor(SpanProcessor):
    """Copies the rollout identity from baggage onto every span as it starts, so that spans made by any
    library (the OpenAI instrumentation, the harness's own) carry it; remembers the last model call."""

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        attributes = span.attributes or {}
        for key, value in baggage_identity(parent_context).items():
            if key not in attributes:
                span.set_attribute(key, value)

    def on_end(self, span: ReadableSpan) -> None:
        # Spans end in the caller's context (inside `create()` or the stream's last chunk), so this
        # is visible to the code that made the call.
        if span.context is not None and is_llm_call(span.attributes or {}):
            LAST_LLM_CALL.set(span.context)


def environment_carrier(environ: Mapping[str, str]) -> dict[str, str]:
    """TRACEPARENT / TRACESTATE / BAGGAGE from an environment, as propagation headers."""
    names = {"TRACEPARENT": "traceparent", "TRACESTATE": "tracestate", "BAGGAGE": "baggage"}
    return {header: environ[name] for name, header in names.items() if environ.get(name)}


def context_environment(context: Context | None = None) -> dict[str, str]:
    """TRACEPARENT / BAGGAGE (/ TRACESTATE) for a child process, from a context (default: the current one)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    return {header.upper(): value for header, value in carrier.items()}


def inject_missing(headers: Any) -> None:
    """Add the current context's propagation headers (traceparent, baggage) that a request lacks.
    An OpenAI instrumentation may already have set traceparent to its own model-call span: keep it."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    for key, value in carrier.items():
        if key not in headers:
            headers[key] = value


def propagate_over_http() -> list[str]:
    """Make every httpx / httpx2 request carry the caller's trace context and baggage, so that a gateway
    sees which rollout a model call belongs to. (The openai client sends through httpx; openai>=3
    ships the `httpx2` fork, which HTTP-client instrumentations for httpx do not patch.)"""
    patched = []
    for module_name in ("httpx", "httpx2"):
        try:
            module = import_module(module_name)
        except ImportError:
            continue
        for client in (module.Client, module.AsyncClient):
            wrap_send(client)
        patched.append(module_name)
    return patched


def wrap_send(client: type) -> None:
    original = client.send
    if getattr(original, "otel_rl_propagates", False):
        return
    if inspect.iscoroutinefunction(original):

        async def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            inject_missing(request.headers)
            return await original(self, request, *args, **kwargs)

    else:

        def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            inject_missing(request.headers)
            return original(self, request, *args, **kwargs)

    send.otel_rl_propagates = True  # type: ignore[attr-defined]
    client.send = send
