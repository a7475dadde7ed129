"""Every HTTP request the server answers, by route and status: an ASGI middleware counting into Prometheus."""

import time
from collections.abc import Iterable, Iterator

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Paths no route matched (a scan, a typo) share one label value: a label per path would grow without bound.
UNMATCHED = "unmatched"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})  # others: "other"
REQUEST_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class HTTPMetrics(Collector):
    """Requests by route template (`/v1/admin/rollouts/{rollout_id}/key`, never a raw path) and status."""

    def __init__(self, fixed_paths: Iterable[str]) -> None:
        # Routes served ahead of FastAPI's router (the gateway's model calls) have no route template.
        self.fixed_paths = frozenset(fixed_paths)
        self.requests = Counter(
            "otel_rl_http_requests",
            "HTTP requests answered, by route, method and status code.",
            ["route", "method", "code"],
            registry=None,
        )
        self.seconds = Histogram(
            "otel_rl_http_request_duration_seconds",
            "Time from a request's arrival to the end of its response (a stream's last byte).",
            ["route", "method"],
            buckets=REQUEST_BUCKETS_S,
            registry=None,
        )
        self.in_flight = Gauge(
            "otel_rl_http_requests_in_flight", "HTTP requests being answered.", registry=None
        )

    def route_of(self, scope: Scope) -> str:
        route = scope.get("route")
        if route is not None and hasattr(route, "path"):
            return route.path
        return scope["path"] if scope["path"] in self.fixed_paths else UNMATCHED

    def collect(self) -> Iterator[Metric]:
        for metric in (self.requests, self.seconds, self.in_flight):
            yield from metric.collect()


class RequestMetrics:
    """ASGI middleware: times each HTTP request and counts it once its response has ended."""

    def __init__(self, app: ASGIApp, metrics: HTTPMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the server answers when the app raises before starting a response

        async def send_counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        metrics = self.metrics
        metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_counted)
        finally:
            metrics.in_flight.dec()
            route = metrics.route_of(scope)
            method = scope["method"] if scope["method"] in METHODS else "other"
            metrics.requests.labels(route, method, str(status)).inc()
            metrics.seconds.labels(route, method).observe(time.perf_counter() - started)
