"""One Prometheus registry for the whole server, and `GET /metrics` serving it in the format asked for."""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fastapi import APIRouter, Request, Response
from fastapi.params import Depends
from prometheus_client import CollectorRegistry, disable_created_metrics
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from otel_rl.collector.ingest_metrics import IngestMetrics
from otel_rl.observability.http import HTTPMetrics
from otel_rl.observability.store import StoreMetrics
from otel_rl.observability.training import TrainingMetrics
from otel_rl.store import Store


@dataclass(frozen=True)
class ServerMetrics:
    """The registry and the metrics that the server's components count into."""

    registry: CollectorRegistry
    http: HTTPMetrics
    ingest: IngestMetrics
    training: TrainingMetrics


def server_metrics(store: Store, *, fixed_paths: Iterable[str], others: Sequence[Collector]) -> ServerMetrics:
    """A registry with the HTTP, ingest, training and store metrics, and `others` (the gateway's)."""
    # Its own registry, not prometheus_client's global one: two servers in one process (tests) stay apart,
    # and nothing a library registers globally leaks into /metrics.
    registry = CollectorRegistry(auto_describe=True)
    # No `_created` series: in the text format each counter and histogram would add a gauge of its creation
    # time, doubling the series Prometheus stores for nothing the dashboards read (process-wide setting).
    disable_created_metrics()
    training = TrainingMetrics()
    metrics = ServerMetrics(
        registry, HTTPMetrics(fixed_paths), IngestMetrics(training.observe_spans), training
    )
    for collector in (metrics.http, metrics.ingest, training, StoreMetrics(store), *others):
        registry.register(collector)
    return metrics


def metrics_router(registry: CollectorRegistry, *, dependencies: Sequence[Depends]) -> APIRouter:
    """`GET /metrics`: the registry in the Prometheus text format, or OpenMetrics when the scraper asks."""
    router = APIRouter()

    @router.get("/metrics", tags=["metrics"], dependencies=list(dependencies))
    def metrics(request: Request) -> Response:
        # A plain function: FastAPI runs it in a thread, as a scrape reads the store's table sizes.
        encode, content_type = choose_encoder(request.headers.get("accept"))
        return Response(encode(registry), media_type=content_type)

    return router
