"""The gateway's counters and the last reload's timings in the Prometheus text format (`GET /metrics`)."""

from collections import Counter

from otel_rl.gateway.reload import ReloadCoordinator, ReloadResult
from otel_rl.gateway.servers import ServerPool

PREFIX = "otel_rl_gateway"
RELOAD_PHASES = ("drain", "pause", "reload", "verify", "resume", "total")


class GatewayMetrics:
    """Counts calls by operation and outcome and reloads by outcome; renders them with the live gauges."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()  # (operation, "ok" | error.type)
        self.reloads: Counter[str] = Counter()  # "ok" | "partial" | "failed"
        self.reload_seconds_sum = 0.0

    def count_call(self, operation: str, error_type: str | None) -> None:
        self.calls[(operation, error_type or "ok")] += 1

    def count_reload(self, result: ReloadResult) -> None:
        outcome = "failed" if not result.ok else "partial" if result.failed else "ok"
        self.reloads[outcome] += 1
        self.reload_seconds_sum += result.total_ms / 1000

    def render(self, coordinator: ReloadCoordinator, pool: ServerPool) -> str:
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {PREFIX}_{name} {help_text}")
            lines.append(f"# TYPE {PREFIX}_{name} {kind}")
            lines.extend(f"{PREFIX}_{name}{labels} {value:g}" for labels, value in samples)

        metric(
            "calls_total",
            "counter",
            "Model calls by operation and outcome (ok or error.type).",
            [
                (f'{{operation="{op}",outcome="{outcome}"}}', n)
                for (op, outcome), n in sorted(self.calls.items())
            ],
        )
        metric("in_flight", "gauge", "Model calls in flight.", [("", coordinator.in_flight)])
        metric("policy_version", "gauge", "Policy version served now.", [("", coordinator.policy.version)])
        metric(
            "server_available",
            "gauge",
            "1 if the inference server takes calls (healthy, not taken out).",
            [(f'{{server="{server.url}"}}', float(server.available)) for server in pool.servers],
        )
        metric(
            "reloads_total",
            "counter",
            "Weight reloads by outcome (partial: some servers taken out).",
            [(f'{{outcome="{outcome}"}}', n) for outcome, n in sorted(self.reloads.items())],
        )
        metric(
            "reload_seconds",
            "summary",
            "Time the gateway was paused for reloads.",
            [("_sum", self.reload_seconds_sum), ("_count", sum(self.reloads.values()))],
        )
        last = coordinator.last_result
        if last is not None:
            metric(
                "last_reload_phase_seconds",
                "gauge",
                "Duration of each phase of the last reload.",
                [(f'{{phase="{phase}"}}', getattr(last, f"{phase}_ms") / 1000) for phase in RELOAD_PHASES],
            )
            metric(
                "last_reload_in_flight_at_pause",
                "gauge",
                "Calls in flight when the last reload paused the gateway.",
                [("", last.in_flight_at_pause)],
            )
            metric("last_reload_aborted", "gauge", "Calls the last reload aborted.", [("", last.aborted)])
        return "\n".join(lines) + "\n"
