"""Trace ids chosen before a span starts: an attempt's TRACEPARENT is in its Job before its span exists.

The controller writes the attempt's trace context into the Job (the harness's spans become children of
it) and exports the `otel_rl.rollout` span with exactly those ids when the attempt ends — possibly from
a restarted controller, long after the one that created the Job is gone.
"""

import contextlib
import contextvars
import secrets
from collections.abc import Iterator

from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

_fixed: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "otel_rl_fixed_ids", default=None
)


class FixedIds(IdGenerator):
    """Random ids, except inside `fixed(trace_id, span_id)`, where the next root span gets those."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()

    @contextlib.contextmanager
    def fixed(self, trace_id: int, span_id: int) -> Iterator[None]:
        token = _fixed.set((trace_id, span_id))
        try:
            yield
        finally:
            _fixed.reset(token)

    def generate_trace_id(self) -> int:
        ids = _fixed.get()
        return ids[0] if ids else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        ids = _fixed.get()
        return ids[1] if ids else self._random.generate_span_id()


def random_traceparent() -> str:
    """A new sampled W3C traceparent (its ids never zero, as the spec requires)."""
    trace_id = secrets.randbits(128) or 1
    span_id = secrets.randbits(64) or 1
    return f"00-{trace_id:032x}-{span_id:016x}-01"


def split_traceparent(value: str) -> tuple[int, int]:
    """(trace id, span id) of a traceparent written by random_traceparent."""
    parts = value.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        raise ValueError(f"not a traceparent: {value!r}")
    return int(parts[1], 16), int(parts[2], 16)
