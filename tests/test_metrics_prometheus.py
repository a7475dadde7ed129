"""A real Prometheus scrapes a real `otel-rl serve`; every query of every dashboard in dashboards/ has data.

The run: model calls through the gateway (to the fake vLLM), OTLP exports from the real OTel SDK over HTTP
and gRPC (one refused as a whole, some records refused inside accepted exports), training step and
evaluation records sent as the trainer sends them (RunRecorder), and a weight reload. Traffic comes in two
rounds a few scrapes apart, so that rates and quantiles over the dashboards' windows have values.
"""

import json
import math
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fake_vllm import MODEL, FakeVLLM
from opentelemetry._logs import LogRecord
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from otel_rl_server import ServerProcess

from otel_rl import attributes as attr
from otel_rl.gateway.vllm import free_ports
from otel_rl.train.records import EvalRecord, RunRecorder, StepRecord

DASHBOARDS = Path(__file__).resolve().parents[1] / "dashboards"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
SCRAPE_S = 1
# What Grafana substitutes for the dashboards' variables (instance: "All", as the variable's allValue).
VARIABLES = {"$__rate_interval": "1m", "$job": "otel-rl", "$instance": ".+"}
HELD_OUT = 'held "out"\nset'  # an eval name that needs escaping in the exposition


class Prometheus:
    """Debian's prometheus on a free loopback port, scraping `target` every second with the bearer token."""

    def __init__(self, workdir: Path, target: str, token: str) -> None:
        (workdir / "token").write_text(token)
        config = {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "scrape_timeout": f"{SCRAPE_S}s"},
            "scrape_configs": [
                {
                    "job_name": "otel-rl",
                    "authorization": {"type": "Bearer", "credentials_file": str(workdir / "token")},
                    "static_configs": [{"targets": [target]}],
                }
            ],
        }
        (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        (port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = workdir / "prometheus.log"
        self.args = [
            PROMETHEUS,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60) -> "Prometheus":
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"prometheus exited:\n{self.log_path.read_text()}"
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"prometheus not ready in {timeout_s}s:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)

    def query(self, promql: str) -> list[dict]:
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10).json()
        assert answer["status"] == "success", (promql, answer)
        return answer["data"]["result"]

    def wait_for(self, promql: str, predicate: Callable[[list], bool], timeout_s: float = 30) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(promql)
            if predicate(result):
                return result
            assert time.monotonic() < deadline, f"{promql} never matched; last: {result}"
            time.sleep(0.5)

    def wait_for_value(self, promql: str, expected: float, timeout_s: float = 30) -> None:
        """Until `promql` gives one sample, of value `expected`."""
        self.wait_for(promql, lambda result: [float(r["value"][1]) for r in result] == [expected], timeout_s)


@pytest.fixture
def scraped_server(tmp_path: Path) -> Iterator[tuple[ServerProcess, Prometheus, FakeVLLM]]:
    with FakeVLLM() as fake:
        server = ServerProcess(tmp_path / "otel_rl.duckdb", tmp_path, flags=("--vllm", fake.url)).start()
        (tmp_path / "prometheus").mkdir()
        prometheus = Prometheus(tmp_path / "prometheus", f"127.0.0.1:{server.http_port}", server.token)
        try:
            prometheus.start()
            yield server, prometheus, fake
        finally:
            prometheus.stop()
            server.stop()


MAX_TOKENS = 8  # the fake's reply, "Fake reply 0." (13 byte tokens), is cut there


def model_calls(server: ServerProcess) -> None:
    url = f"{server.http_url}/v1/chat/completions"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "What is 6 * 7?"}]}
    for stream in (False, False, True):
        asked = body | {"stream": stream, "max_tokens": MAX_TOKENS}
        answer = httpx.post(url, json=asked, headers=server.auth, timeout=30)
        assert answer.status_code == 200, answer.text
        if not stream:
            assert answer.json()["usage"]["completion_tokens"] == MAX_TOKENS


def otlp_exports(server: ServerProcess, rollout_key: str, round_number: int) -> None:
    """Spans (admin, and a rollout key's with one refused span) and metrics over HTTP, logs over gRPC."""
    traces, admin = f"{server.http_url}/v1/traces", {"authorization": f"Bearer {server.token}"}
    for headers in (admin, {"authorization": f"Bearer {rollout_key}"}):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=traces, headers=headers)))
        tracer = provider.get_tracer("agent")
        with tracer.start_as_current_span("agent step", attributes={"round": round_number}):
            tracer.start_span("tool call").end()
        # A rollout key may only write for its own rollout: this span is refused, its neighbours kept.
        tracer.start_span("elsewhere", attributes={attr.ROLLOUT_ID: "another-rollout"}).end()
        provider.shutdown()
    logs = LoggerProvider()
    exporter = OTLPLogExporter(endpoint=f"http://{server.grpc_target}", insecure=True, headers=admin)
    logs.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    logs.get_logger("agent").emit(LogRecord(body=f"round {round_number}", event_name="agent.note"))
    logs.shutdown()
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=f"{server.http_url}/v1/metrics", headers=admin),
        export_interval_millis=60_000,
    )
    meters = MeterProvider(metric_readers=[reader])
    meters.get_meter("agent").create_counter("agent.turns").add(3)
    meters.shutdown()  # exports once
    refused = httpx.post(traces, content=b"\x00", headers={"authorization": "Bearer wrong"}, timeout=10)
    assert refused.status_code == 401


def training_records(server: ServerProcess, step: int) -> None:
    """What an online run's trainer sends the server after a step (and, at step 2, after an evaluation)."""
    recorder = RunRecorder(server.http_url, server.token, run_id="metrics-run")
    record = StepRecord(
        step=step, policy_version=step, group_ids=["g-1", "g-2"], reward_mean=0.25 * step,
        success_rate=0.5, rollouts=8, samples=16, sampled_tokens=400, response_tokens=480, stale_groups=1,
        collect_s=2.0, transform_s=0.2, train_s=3.0, save_s=0.5, reload_s=0.6, paused_s=0.3, drain_s=0.1,
        wall_s=6.3, trainer={"mismatch": 2e-7, "loss": -0.05},
    )  # fmt: skip
    recorder.record(attr.TRAIN_STEP_SPAN_NAME, record, time.time_ns())
    if step == 2:
        val = EvalRecord(name=HELD_OUT, step=2, policy_version=2, rollouts=4, reward_mean=0.75,
                         success_rate=0.75, wall_s=1.5)  # fmt: skip
        recorder.record(attr.TRAIN_EVAL_SPAN_NAME, val, time.time_ns())
    recorder.close()


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, PromQL with the variables substituted) of every target of every panel."""
    queries = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        dashboard = json.loads(path.read_text())
        variables = {v["name"]: v["type"] for v in dashboard["templating"]["list"]}
        assert variables.get("datasource") == "datasource", f"{path.name}: no Prometheus datasource variable"
        for panel in dashboard["panels"]:
            assert panel["datasource"]["uid"] == "${datasource}", (path.name, panel["title"])
            for target in panel["targets"]:
                expr = target["expr"]
                for name, value in VARIABLES.items():
                    expr = expr.replace(name, value)
                assert "$" not in expr, f"{path.name} {panel['title']}: a variable left in {expr}"
                queries.append((path.name, panel["title"], expr))
    return queries


def test_prometheus_scrapes_the_server_and_every_dashboard_query_has_data(scraped_server) -> None:
    server, prometheus, fake = scraped_server
    prometheus.wait_for('up{job="otel-rl"}', lambda result: result and result[0]["value"][1] == "1")
    key = httpx.post(f"{server.http_url}/v1/admin/rollouts/r-metrics/key", headers=server.auth, timeout=10)
    rollout_key = key.json()["key"]

    for round_number in (1, 2):
        model_calls(server)
        otlp_exports(server, rollout_key, round_number)
        training_records(server, step=round_number)
        # Prometheus holds the round before the next begins: counters rise from one scrape to a later one.
        prometheus.wait_for_value("otel_rl_train_step", round_number)
        prometheus.wait_for_value('sum(otel_rl_gateway_calls_total{outcome="ok"})', 3 * round_number)
    # The fake has no weights to reload (no dev-mode endpoints): the reload fails, measured like any other.
    checkpoint = server.workdir / "step-3"
    checkpoint.mkdir()
    update = {"version": 3, "checkpoint": str(checkpoint)}
    reload = httpx.post(f"{server.http_url}/v1/admin/policy", json=update, headers=server.auth, timeout=60)
    assert reload.status_code == 502, reload.text

    prometheus.wait_for("otel_rl_gateway_last_reload_phase_seconds", bool)
    # The series made last, the reload's phases, scraped at least twice (so every series was): rates and
    # increases over every series have values.
    last_made = "min(count_over_time(otel_rl_gateway_last_reload_phase_seconds[1m]))"
    prometheus.wait_for(last_made, lambda result: result and float(result[0]["value"][1]) >= 2)

    # What was sent is what Prometheus holds.
    def value(promql: str) -> float:
        [sample] = prometheus.query(promql)
        return float(sample["value"][1])

    assert value('min_over_time(up{job="otel-rl"}[1m])') == 1  # every scrape of the run succeeded
    assert value('sum(otel_rl_gateway_calls_total{outcome="ok"})') == 6
    assert value('sum(otel_rl_gateway_tokens_total{kind="completion"})') == 6 * MAX_TOKENS
    assert value('otel_rl_collector_records_total{outcome="rejected", reason="identity"}') == 2
    assert value('sum(otel_rl_collector_exports_total{outcome="unauthorized"})') == 2
    assert value('sum(otel_rl_collector_exports_total{transport="grpc", signal="logs", outcome="ok"})') == 2
    assert value("otel_rl_train_stale_groups_total") == 2
    assert value("otel_rl_train_mismatch") == 2e-7
    assert value('otel_rl_train_step_phase_seconds{phase="train"}') == 3.0
    assert value("otel_rl_train_samples_total") == 32
    [val] = prometheus.query('otel_rl_train_reward_mean{split="val"}')
    assert val["metric"]["eval"] == HELD_OUT and float(val["value"][1]) == 0.75
    assert value('sum(otel_rl_gateway_reloads_total{outcome=~"ok|partial|failed"})') == 1
    stored = server.scalar("SELECT count(*) FROM spans")  # nothing is sent any more: the count holds
    prometheus.wait_for_value('otel_rl_store_rows{table="spans"}', stored)

    queries = dashboard_queries()
    assert {name for name, _, _ in queries} == {
        "otel-rl-gateway.json",
        "otel-rl-ingest.json",
        "otel-rl-training.json",
    }
    empty = []
    for name, title, expr in queries:
        values = [float(sample["value"][1]) for sample in prometheus.query(expr)]
        if not any(math.isfinite(v) for v in values):
            empty.append(f"{name} / {title}: {expr} -> {values}")
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)
