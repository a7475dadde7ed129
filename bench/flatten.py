"""Micro-benchmark: OTLP trace flattening (spans/s) next to the protobuf parse rate of the same payload."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_rl.collector.flatten import traces_to_tables

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "captures" / "otel"
SPANS_PER_REQUEST = 512
TARGET_SPANS_PER_S = 50_000  # flatten's share of the collector's 20K spans/s end-to-end budget


def fixture_spans() -> list[Span]:
    """The spans (every dialect, plus the harness's own) of the protobuf fixture runs."""
    out = []
    for path in sorted(FIXTURES.glob("*/*/*_traces.bin")):
        req = ExportTraceServiceRequest.FromString(path.read_bytes())
        out += [span for rs in req.resource_spans for ss in rs.scope_spans for span in ss.spans]
    return out


def gateway_span(template: Span, rng: np.random.Generator) -> Span:
    """A fixture span plus packed token arrays like the gateway writes (300 prompt, 2 x 200 completion)."""
    span = Span()
    span.CopyFrom(template)

    def packed(key: str, values: np.ndarray) -> KeyValue:
        return KeyValue(key=key, value=AnyValue(bytes_value=values.tobytes()))

    span.attributes.append(packed("otel_rl.prompt_token_ids", rng.integers(0, 150_000, 300, dtype="<i4")))
    for i in range(2):
        span.attributes.append(
            packed(f"otel_rl.choices.{i}.token_ids", rng.integers(0, 150_000, 200, dtype="<i4"))
        )
        span.attributes.append(packed(f"otel_rl.choices.{i}.logprobs", -rng.random(200, dtype="<f4")))
    return span


def build_request(spans: list[Span], gateway_share: float) -> bytes:
    """One request of SPANS_PER_REQUEST spans cycling through the fixtures; a share of them gateway-like."""
    rng = np.random.default_rng(0)
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="bench")))
    ss = rs.scope_spans.add()
    n_gateway = int(SPANS_PER_REQUEST * gateway_share)
    for i in range(SPANS_PER_REQUEST):
        span = spans[i % len(spans)]
        ss.spans.append(gateway_span(span, rng) if i < n_gateway else span)
    return req.SerializeToString()


def cpu_seconds(fn: Callable[[bytes], object], payload: bytes, repeat: int) -> float:
    """CPU seconds of one fn(payload) call: best of `repeat` (CPU time, as the machine may be shared)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(5):
            fn(payload)
        best = min(best, (time.process_time() - start) / 5)
    return best


def main() -> None:
    spans = fixture_spans()
    now = datetime.now(UTC)
    print(f"{len(spans)} distinct fixture spans, {SPANS_PER_REQUEST} spans per request, one core, CPU time")
    print(f"load average {os.getloadavg()[0]:.1f} (other processes on the cores slow both columns)\n")
    print(f"{'payload':<34}{'KiB/req':>9}{'parse spans/s':>15}{'flatten spans/s':>17}{'parse share':>13}")
    for label, share in (("fixture spans", 0.0), ("fixture spans, 25% with tokens", 0.25)):
        payload = build_request(spans, share)
        parse = flatten = float("inf")
        for _ in range(4):  # interleaved rounds, so that both see the same machine load
            parse = min(parse, cpu_seconds(ExportTraceServiceRequest.FromString, payload, 3))
            flatten = min(
                flatten,
                cpu_seconds(
                    lambda b: traces_to_tables(ExportTraceServiceRequest.FromString(b), now, "admin"),
                    payload,
                    3,
                ),
            )
        print(
            f"{label:<34}{len(payload) / 1024:>9.0f}{SPANS_PER_REQUEST / parse:>15,.0f}"
            f"{SPANS_PER_REQUEST / flatten:>17,.0f}{parse / flatten:>13.0%}"
        )
    verdict = "meets" if SPANS_PER_REQUEST / flatten >= TARGET_SPANS_PER_S else "MISSES"
    print(f"\nflatten (parse included) {verdict} the {TARGET_SPANS_PER_S:,} spans/s target")


if __name__ == "__main__":
    main()
