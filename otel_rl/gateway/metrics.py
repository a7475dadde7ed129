"""The gateway's Prometheus metrics: calls, latency, tokens and reloads counted; pool and policy read."""

from collections.abc import Iterator

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from otel_rl.gateway.recording import OPERATION_APIS, CallRecord
from otel_rl.gateway.reload import ReloadCoordinator
from otel_rl.gateway.reload_result import ReloadResult
from otel_rl.gateway.servers import ServerPool

RELOAD_PHASES = ("drain", "pause", "reload", "verify", "resume", "total")
# A model call takes from milliseconds (a cached prompt on a small model) to minutes (a long agent turn).
CALL_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
RELOAD_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# A colocated pause spans the trainer's update too: seconds to many minutes
PAUSE_BUCKETS_S = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


class GatewayMetrics(Collector):
    """What the gateway counts as calls and reloads end (a collector: the server registers it)."""

    def __init__(self) -> None:
        # Not registered on their own: `collect` yields them, so one registry holds every server's metrics.
        self.calls = Counter(
            "otel_rl_gateway_calls",
            "Model calls by API and outcome (ok, or the call span's error.type).",
            ["api", "outcome"],
            registry=None,
        )
        self.call_seconds = Histogram(
            "otel_rl_gateway_call_duration_seconds",
            "Model call duration, from admission to the last byte relayed.",
            ["api"],
            buckets=CALL_BUCKETS_S,
            registry=None,
        )
        self.first_chunk_seconds = Histogram(
            "otel_rl_gateway_time_to_first_chunk_seconds",
            "Streamed calls: time from admission to vLLM's first chunk.",
            ["api"],
            buckets=CALL_BUCKETS_S,
            registry=None,
        )
        self.tokens = Counter(
            "otel_rl_gateway_tokens",
            "Tokens of model calls as vLLM counted them, else their token ids"
            " (kind: prompt, completion, cached_prompt).",
            ["api", "kind"],
            registry=None,
        )
        self.reloads = Counter(
            "otel_rl_gateway_reloads",
            "Weight reloads by outcome (ok, partial: some servers taken out, failed).",
            ["outcome"],
            registry=None,
        )
        self.reload_seconds = Histogram(
            "otel_rl_gateway_reload_phase_duration_seconds",
            "Duration of each reload phase (total: the time new calls were held).",
            ["phase"],
            buckets=RELOAD_BUCKETS_S,
            registry=None,
        )
        self.reload_aborted = Counter(
            "otel_rl_gateway_reload_aborted_calls", "Calls in flight that reloads aborted.", registry=None
        )
        self.colocated_pause_seconds = Histogram(
            "otel_rl_gateway_colocated_pause_seconds",
            "Per colocated update, how long new calls were held: drain, sleep, the trainer's update, wake,"
            " reload.",
            buckets=PAUSE_BUCKETS_S,
            registry=None,
        )
        for outcome in ("ok", "partial", "failed"):  # at 0 from the start: increase() counts the first reload
            self.reloads.labels(outcome)

    def count_call(self, record: CallRecord) -> None:
        api = record.api or OPERATION_APIS[record.operation]
        self.calls.labels(api, record.error_type or "ok").inc()
        self.call_seconds.labels(api).observe(max(0, record.end_ns - record.start_ns) / 1e9)
        if record.time_to_first_chunk_s is not None:
            self.first_chunk_seconds.labels(api).observe(record.time_to_first_chunk_s)
        output = record.output
        if output is not None:
            for kind, count in (
                ("prompt", output.prompt_tokens()),
                ("completion", output.completion_tokens()),
                ("cached_prompt", output.cache_read_tokens),
            ):
                if count:
                    self.tokens.labels(api, kind).inc(count)

    def count_reload(self, result: ReloadResult) -> None:
        outcome = "failed" if not result.ok else "partial" if result.failed else "ok"
        self.reloads.labels(outcome).inc()
        for phase in RELOAD_PHASES:
            self.reload_seconds.labels(phase).observe(getattr(result, f"{phase}_ms") / 1000)
        self.reload_aborted.inc(result.aborted)

    def count_colocated(self, result: ReloadResult) -> None:
        """A colocated update: counted as a reload, and its whole pause observed."""
        self.count_reload(result)
        self.colocated_pause_seconds.observe(result.total_ms / 1000)

    def collect(self) -> Iterator[Metric]:
        for metric in (
            self.calls,
            self.call_seconds,
            self.first_chunk_seconds,
            self.tokens,
            self.reloads,
            self.reload_seconds,
            self.reload_aborted,
            self.colocated_pause_seconds,
        ):
            yield from metric.collect()


class GatewayState(Collector):
    """The gateway's state, read at each scrape: calls in flight, policy version, servers, last reload."""

    def __init__(self, coordinator: ReloadCoordinator, pool: ServerPool) -> None:
        self.coordinator = coordinator
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "otel_rl_gateway_calls_in_flight", "Model calls in flight.", value=self.coordinator.in_flight
        )
        yield GaugeMetricFamily(
            "otel_rl_gateway_policy_version",
            "Policy version served now.",
            value=self.coordinator.policy.version,
        )
        available = GaugeMetricFamily(
            "otel_rl_gateway_server_available",
            "1 if the inference server takes calls (answers its probe and was not taken out by a reload).",
            labels=["server"],
        )
        in_flight = GaugeMetricFamily(
            "otel_rl_gateway_server_calls_in_flight", "Calls in flight on each server.", labels=["server"]
        )
        for server in self.pool.servers:
            available.add_metric([server.url], float(server.available))
            in_flight.add_metric([server.url], server.in_flight)
        yield available
        yield in_flight
        last = self.coordinator.last_result
        if last is not None:
            phases = GaugeMetricFamily(
                "otel_rl_gateway_last_reload_phase_seconds",
                "Duration of each phase of the last reload.",
                labels=["phase"],
            )
            for phase in RELOAD_PHASES:
                phases.add_metric([phase], getattr(last, f"{phase}_ms") / 1000)
            yield phases
            yield GaugeMetricFamily(
                "otel_rl_gateway_last_reload_in_flight_at_pause",
                "Calls in flight when the last reload paused the gateway.",
                value=last.in_flight_at_pause,
            )
