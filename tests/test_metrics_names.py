"""The server's /metrics: Prometheus naming conventions, bounded labels, and label values escaped."""

import re
import time
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from otel_rl import attributes as attr
from otel_rl.collector.ingest import traces_batch
from otel_rl.gateway.outputs import CallOutput
from otel_rl.gateway.recording import CallRecord
from otel_rl.gateway.reload_result import ReloadResult, ServerReload
from otel_rl.server import ServeSettings, create_app
from otel_rl.train.records import EvalRecord, StepRecord

NAME = re.compile(r"^otel_rl_[a-z][a-z0-9_]*$")
# Labels whose values are bounded by the code or the configuration; an id would make a series per value.
ALLOWED_LABELS = {
    "api", "outcome", "kind", "phase", "server", "route", "method", "code", "signal", "transport", "reason",
    "table", "split", "eval", "le",
}  # fmt: skip
HOSTILE_EVAL = 'held "out"\nset \\ two'


def training_spans(store, records: list[tuple[str, StepRecord | EvalRecord]]):
    """The stored-batch rows of the spans a RunRecorder sends for `records` (same attributes, same scope)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer(attr.TRAIN_SCOPE)
    for name, record in records:
        values = vars(record).copy()
        trainer = values.pop("trainer", {})
        attributes = {attr.TRAIN_RUN_ID: "run-1", attr.POLICY_VERSION: record.policy_version}
        attributes |= {f"{attr.TRAIN_PREFIX}{k}": v for k, v in values.items() if k != "policy_version"}
        attributes |= {f"{attr.TRAIN_PREFIX}trainer.{k}": v for k, v in trainer.items()}
        tracer.start_span(name, attributes=attributes).end()
    return traces_batch(encode_spans(exporter.get_finished_spans()), "admin")["spans"]


def step(number: int) -> StepRecord:
    return StepRecord(
        step=number, policy_version=number, group_ids=["g"], reward_mean=0.5, success_rate=0.25, rollouts=4,
        samples=8, sampled_tokens=100, response_tokens=120, stale_groups=1, collect_s=1.0, transform_s=0.1,
        train_s=2.0, save_s=0.3, reload_s=0.4, paused_s=0.2, drain_s=0.1, wall_s=3.9,
        trainer={"mismatch": 1e-7, "loss": -0.1}, transform_wait_s=0.04, transform_read_s=0.05,
        transform_build_s=0.01,
    )  # fmt: skip


@pytest.fixture
def app(tmp_path: Path):
    settings = ServeSettings(
        db=tmp_path / "otel_rl.duckdb", token="t", grpc_port=None, vllm=("http://127.0.0.1:9",)
    )
    app = create_app(settings)
    yield app
    app.state.store.close()


def exposition(app) -> str:
    return generate_latest(app.state.metrics.registry).decode()


def test_every_metric_follows_prometheus_conventions(app) -> None:
    gateway, metrics = app.state.gateway, app.state.metrics
    record = CallRecord(
        "chat", {"model": "m"}, {}, {}, None, 0, time.time_ns() - 10**8, end_ns=time.time_ns()
    )
    record.output = CallOutput(input_tokens=12, output_tokens=5)
    gateway.metrics.count_call(record)
    result = ReloadResult(1, 0, "/ckpt", None, [ServerReload("http://127.0.0.1:9", ok=True)], total_ms=12)
    gateway.metrics.count_reload(result)
    gateway.coordinator.last_result = result
    metrics.training.observe_spans(training_spans(app.state.store, [(attr.TRAIN_STEP_SPAN_NAME, step(1))]))

    families = list(text_string_to_metric_families(exposition(app)))
    names = {family.name for family in families}
    for expected in ("otel_rl_gateway_calls", "otel_rl_store_rows", "otel_rl_train_mismatch"):
        assert expected in names
    for family in families:
        assert NAME.match(family.name), family.name
        assert not re.search(r"(_ms|milliseconds|_kb|_mb)(_|$)", family.name), family.name
        for sample in family.samples:
            if family.type == "counter":
                assert sample.name.endswith(("_total", "_created")), sample.name
            assert set(sample.labels) <= ALLOWED_LABELS, (sample.name, sample.labels)
        if "seconds" in family.name or "bytes" in family.name:
            assert family.name.endswith(("_seconds", "_bytes")), family.name
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}
    assert values[("otel_rl_gateway_calls_total", (("api", "chat_completions"), ("outcome", "ok")))] == 1
    assert values[("otel_rl_gateway_tokens_total", (("api", "chat_completions"), ("kind", "prompt")))] == 12
    assert values[("otel_rl_gateway_server_available", (("server", "http://127.0.0.1:9"),))] == 1
    assert values[("otel_rl_train_step_phase_seconds", (("phase", "train"),))] == 2.0
    assert values[("otel_rl_train_step_transform_seconds", (("phase", "wait"),))] == 0.04
    assert values[("otel_rl_train_step_transform_seconds", (("phase", "build"),))] == 0.01
    assert values[("otel_rl_store_normalize_lag_seconds", ())] == 0  # nothing written: caught up
    assert values[("otel_rl_train_mismatch", ())] == 1e-7


def test_label_values_are_escaped_and_bounded(app) -> None:
    metrics = app.state.metrics
    val = EvalRecord(name=HOSTILE_EVAL, step=1, policy_version=1, rollouts=4, reward_mean=0.75,
                     success_rate=0.5, wall_s=1.0)  # fmt: skip
    metrics.training.observe_spans(training_spans(app.state.store, [(attr.TRAIN_EVAL_SPAN_NAME, val)]))
    text = exposition(app)

    # Quotes, backslashes and newlines are escaped in the text: the line stays one sample.
    assert 'eval="held \\"out\\"\\nset \\\\ two",split="val"} 0.75' in text
    parsed = {
        sample.labels.get("eval"): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "otel_rl_train_reward_mean"
        for sample in family.samples
    }
    assert parsed == {HOSTILE_EVAL: 0.75}

    # Eval names beyond the bound share one label value instead of adding series.
    many = [(attr.TRAIN_EVAL_SPAN_NAME, EvalRecord(f"eval-{i}", 1, 1, 4, 0.1, 0.1, 1.0)) for i in range(40)]
    metrics.training.observe_spans(training_spans(app.state.store, many))
    evals = {
        sample.labels["eval"]
        for family in text_string_to_metric_families(exposition(app))
        if family.name == "otel_rl_train_reward_mean"
        for sample in family.samples
    }
    assert len(evals) == 17 and "other" in evals and HOSTILE_EVAL in evals


def test_no_training_gauge_is_exported_before_a_step_arrives(app) -> None:
    text = exposition(app)
    assert "otel_rl_train_steps_total 0.0" in text
    for gauge in (
        "otel_rl_train_mismatch",
        "otel_rl_train_step ",
        "otel_rl_gateway_last_reload_phase_seconds{",
    ):
        assert gauge not in text
