"""`otel-rl serve`: one process with the OTLP receivers (HTTP and gRPC), the query API and rewards."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, ConfigDict, Field

from otel_rl.archive_api import ScheduleSettings
from otel_rl.auth import DEFAULT_KEY_LIFETIME_S
from otel_rl.connections import ConnectionLimits
from otel_rl.gateway.limits import RequestLimits
from otel_rl.store.connection import default_db

if TYPE_CHECKING:
    from rich.console import Console

Port = Annotated[int, Field(ge=0, le=65535)]  # 0: any free port


class ServeSettings(BaseModel):
    """Everything `otel-rl serve` is configured with (flags, else environment variables, else defaults)."""

    model_config = ConfigDict(extra="forbid")

    db: Path = Field(default_factory=default_db)
    host: str = "127.0.0.1"
    http_port: Port = 4318
    grpc_port: Port | None = 4317  # None: no gRPC receiver
    token: str | None = (
        None  # None: token_file, else OTEL_RL_TOKEN(_FILE), else .otel_rl/token, else a new one
    )
    token_file: Path | None = None
    public_docs: bool = False  # /docs, /redoc and /openapi.json without the admin token
    public_metrics: bool = False  # /metrics without the admin token
    query_timeout_s: float = Field(10.0, gt=0)
    query_max_bytes: int = Field(256 * 1024 * 1024, ge=1)
    query_concurrency: int = Field(4, ge=1)
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1)
    # Gateway (docs/gateway.md): a local vLLM started for this model folder, and/or running vLLM servers.
    model: Path | None = None
    # the local vLLM loads LoRA adapters up to this rank (`lora_adapter`)
    lora_rank: int | None = Field(None, ge=1)
    # the local vLLM's context, in tokens; None: what the model declares
    max_model_len: int | None = Field(None, ge=1)
    # local vLLM servers of `model`, each on its own devices (gateway/vllm_replicas.py)
    replicas: int = Field(1, ge=1)
    vllm_args: tuple[str, ...] = ()  # vLLM's own flags for the local servers, checked by vLLM's parser
    vllm: tuple[str, ...] = ()
    forward_otlp: str | None = None  # also send the gateway's spans to this OTLP/HTTP traces endpoint
    split_sampling: dict | None = None  # {"train": {...}, "val": {...}}; None: the gateway's defaults
    request_limits: RequestLimits | None = None  # what one model call may ask for; None: the defaults
    upstream_timeout_s: float = Field(600.0, gt=0)  # one model call through the gateway
    # how long a reload lets calls in flight finish before aborting them
    drain_timeout_s: float = Field(30.0, ge=0)
    # Rollouts and training on the same devices: the servers sleep while the trainer updates (colocated.py)
    colocated: bool = False
    tokenizer: Path | None = None  # the model folder whose tokenizer decodes tokens in /ui; default: model
    archive: ScheduleSettings | None = None  # an archive run at start, then hourly; None: no run
    # a rollout key is refused this long after issue
    rollout_key_lifetime_s: float = Field(DEFAULT_KEY_LIFETIME_S, gt=0)
    # The HTTP port's caps and read deadlines (otel_rl/connections.py, docs/security.md#availability)
    connections: ConnectionLimits = Field(default_factory=ConnectionLimits)
    # after SIGTERM, how long requests in flight may take to finish
    shutdown_timeout_s: float = Field(10.0, ge=0)


def create_app(settings: ServeSettings):  # noqa: ANN201 - FastAPI, imported lazily to keep the CLI fast
    """The server's FastAPI app; opens the store now, starts gRPC with the app and closes both after it."""
    from fastapi import Depends, FastAPI, Header, Request
    from fastapi.encoders import jsonable_encoder
    from fastapi.exceptions import RequestValidationError
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
    from fastapi.responses import HTMLResponse, JSONResponse

    from otel_rl.archive_api import ArchiveSchedule, archive_router
    from otel_rl.auth import Auth, Forbidden, Unauthorized, admin_required, admin_token
    from otel_rl.coding.task_table import tasks_router
    from otel_rl.collector.http import collector_router
    from otel_rl.collector.rewards import rewards_router
    from otel_rl.gateway.metrics import GatewayState
    from otel_rl.gateway.protocols import protocols
    from otel_rl.gateway.routes import CALL_PATHS, COUNT_TOKENS_PATH, ModelCallRoutes, gateway_router
    from otel_rl.observability.exposition import metrics_router, server_metrics
    from otel_rl.observability.http import RequestMetrics
    from otel_rl.query_api import QueryLimits, QuerySlots, RunningQueries, query_router
    from otel_rl.response_headers import SecurityHeaders
    from otel_rl.store import Store
    from otel_rl.ui.link import ui_address, ui_link
    from otel_rl.ui.routes import ui_router

    store = Store(settings.db)
    token, token_source = admin_token(settings.token, explicit_file=settings.token_file)
    lifetime_s = settings.rollout_key_lifetime_s
    auth = Auth(store, token, key_lifetime_s=lifetime_s, admin_token_source=token_source)
    archiving = ArchiveSchedule(store, settings.archive) if settings.archive is not None else None
    gateway, local_vllm = _gateway(settings, store, auth)
    metrics = server_metrics(
        store,
        fixed_paths=(*CALL_PATHS, *protocols(), COUNT_TOKENS_PATH, "/"),  # served ahead of the router
        others=(gateway.metrics, GatewayState(gateway.coordinator, gateway.pool)),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        grpc_server = None
        if settings.grpc_port is not None:
            from otel_rl.collector.grpc import start_grpc_server

            grpc_server, app.state.grpc_port = start_grpc_server(
                store,
                auth,
                metrics.ingest,
                host=settings.host,
                port=settings.grpc_port,
                limits=settings.connections,
            )
        if local_vllm is not None:
            local_vllm.start()
        await gateway.start()
        if archiving is not None:
            archiving.start()
        try:
            yield
        finally:
            await gateway.stop()
            if local_vllm is not None:
                local_vllm.stop()
            if grpc_server is not None:
                grpc_server.stop(grace=5).wait()
            if archiving is not None:
                archiving.stop()
            store.close()

    # FastAPI's own OpenTelemetry off: the server is where telemetry ends up, and tracing its own requests
    # would send every export's spans back to itself (and asked for the providers on every request: ~2% of
    # a gateway call's CPU).
    no_telemetry = {"tracing": False, "metrics": False, "logs": False}
    # The docs are served below, behind the admin token unless --public-docs: the API's shape is no secret,
    # but a server reachable beyond its operators need not describe itself to anyone who asks.
    app = FastAPI(
        title="otel-rl",
        lifespan=lifespan,
        telemetry=no_telemetry,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.settings = settings
    app.state.store = store
    app.state.auth = auth
    app.state.token_source = token_source
    app.state.metrics = metrics
    app.state.ui_address = ui_address(settings.host, settings.http_port)
    app.state.ui_url = ui_link(settings.host, settings.http_port, token)  # holds the token: never in a log
    app.include_router(collector_router(store, auth, metrics.ingest, max_body_bytes=settings.max_body_bytes))
    limits = QueryLimits(
        timeout_s=settings.query_timeout_s,
        max_result_bytes=settings.query_max_bytes,
        max_concurrent=settings.query_concurrency,
    )
    app.state.queries = RunningQueries()
    query_slots = QuerySlots(limits)  # the web view's queries take them too
    app.include_router(query_router(store, auth, limits, app.state.queries, query_slots))
    app.include_router(rewards_router(store, auth))
    app.include_router(archive_router(store, auth))
    app.include_router(tasks_router(store, auth))
    ui_tokenizer = settings.tokenizer or settings.model
    app.include_router(
        ui_router(
            store,
            auth,
            tokenizer_folder=ui_tokenizer,
            timeout_s=settings.query_timeout_s,
            slots=query_slots,
        )
    )
    app.state.gateway = gateway
    app.include_router(gateway_router(gateway))
    app.add_middleware(ModelCallRoutes, gateway=gateway)
    app.add_middleware(SecurityHeaders)  # on every answer, the gateway's included
    app.add_middleware(RequestMetrics, metrics=metrics.http)  # the outermost: sees every request
    metrics_auth = [] if settings.public_metrics else [Depends(admin_required(auth))]
    app.include_router(metrics_router(metrics.registry, dependencies=metrics_auth))

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # Every route whose body FastAPI validates is an admin route, and FastAPI parses a body before it
        # runs the credential dependency: a request without the token hears 401 here, not what its body lacks.
        try:
            auth.require_admin(request.headers.get("authorization"))
        except Unauthorized as denied:
            return JSONResponse({"detail": str(denied)}, 401, headers={"WWW-Authenticate": "Bearer"})
        except Forbidden as denied:
            return JSONResponse({"detail": str(denied)}, 403)
        # FastAPI echoes each bad value in its 422, and one JSON cannot hold (a NaN reward) made it a 500.
        errors = [{key: value for key, value in error.items() if key != "input"} for error in exc.errors()]
        return JSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)

    docs_auth = [] if settings.public_docs else [Depends(admin_required(auth))]

    @app.get("/openapi.json", include_in_schema=False, dependencies=docs_auth)
    def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=docs_auth)
    def swagger() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="otel-rl")

    @app.get("/redoc", include_in_schema=False, dependencies=docs_auth)
    def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title="otel-rl")

    @app.get("/healthz", tags=["health"])
    def healthz(authorization: Annotated[str | None, Header()] = None) -> dict:
        try:  # the store's path and state are the operator's: anyone else hears only that the server is up
            auth.require_admin(authorization)
        except PermissionError:  # Unauthorized, Forbidden
            return {"status": "ok"}
        # `writes`: why the store refuses writes now (a full disk), else null; `normalized`: how far the
        # normalized tables are behind the raw ones (commits, and how long the oldest has waited), and why
        # rounds fail (else null)
        normalizer = store.normalizer
        normalized = {
            "through": normalizer.through,
            "lag": normalizer.lag,
            "lag_seconds": round(normalizer.lag_seconds, 3),
            "failure": normalizer.failure,
        }
        return {
            "status": "ok",
            "db": str(store.path),
            "views": store.views,
            "writes": store.write_failure,
            "normalized": normalized,
        }

    return app


def _gateway(settings: ServeSettings, store, auth):  # noqa: ANN001, ANN202 - lazily imported types
    """The gateway over the configured vLLM servers, and the local vLLM servers to start for `--model`
    (checked now, before anything starts: ValueError names the flag at fault)."""
    from otel_rl.gateway.proxy import Gateway
    from otel_rl.gateway.settings import GatewaySettings
    from otel_rl.gateway.vllm_machine import this_machine
    from otel_rl.gateway.vllm_replicas import LocalReplicas

    local = None
    if settings.model is not None:
        machine = this_machine()
        # vLLM's GPU build sleeps only in sleep mode; its CPU build refuses the flag and ignores sleep
        sleep_mode = ("--enable-sleep-mode",) if settings.colocated and machine.gpus else ()
        local = LocalReplicas(
            settings.model,
            machine=machine,
            replicas=settings.replicas,
            vllm_args=settings.vllm_args + sleep_mode,
            lora_rank=settings.lora_rank,
            max_model_len=settings.max_model_len,
        )
        local.check_args()
    servers = (local.urls if local else ()) + tuple(settings.vllm)
    options = {"split_sampling": settings.split_sampling} if settings.split_sampling is not None else {}
    if settings.request_limits is not None:
        options["request_limits"] = settings.request_limits
    if settings.colocated:  # a call waits out the trainer's update as it would a long generation, not 30 s
        options["pause_wait_s"] = settings.upstream_timeout_s
    gateway_settings = GatewaySettings(
        servers=servers,
        forward_otlp=settings.forward_otlp,
        upstream_timeout_s=settings.upstream_timeout_s,
        drain_timeout_s=settings.drain_timeout_s,
        colocated=settings.colocated,
        **options,
    )
    return Gateway(gateway_settings, auth=auth, store=store), local


def uvicorn_config(app, settings: ServeSettings):  # noqa: ANN001, ANN201 - uvicorn is imported lazily
    """uvicorn's configuration of the HTTP port: its caps and read deadlines, and a bounded shutdown."""
    from functools import partial

    import uvicorn

    from otel_rl.connections import ConnectionCounts, raise_descriptor_limit
    from otel_rl.guarded_http import GuardedHttpProtocol

    raise_descriptor_limit()  # before the caps are set within it
    counts = ConnectionCounts.within_descriptors(settings.connections)
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.http_port,
        log_level="warning",
        access_log=False,
        http=partial(GuardedHttpProtocol, counts=counts),
        ws="none",  # no route is a WebSocket; an upgraded connection would leave the counts
        timeout_graceful_shutdown=settings.shutdown_timeout_s,
    )


def uvicorn_server(config, *, on_exit):  # noqa: ANN001, ANN202 - uvicorn is imported lazily
    """A uvicorn server that calls `on_exit` as soon as it is told to stop."""
    import uvicorn

    class Server(uvicorn.Server):
        # uvicorn waits for requests in flight before the lifespan's shutdown: a query would hold it.
        def handle_exit(self, sig: int, frame) -> None:  # noqa: ANN001
            on_exit()
            super().handle_exit(sig, frame)

    return Server(config)


def serve_until_interrupted(db: Path, *, tokenizer: Path | None, console: "Console") -> None:
    """An app over a finished run's store `db` (the end of `otel-rl demo`) on a free loopback port (no gRPC,
    no vLLM behind the gateway), with a new admin token; prints the web view's link (also written beside the
    store, ui/link.py) and returns once Ctrl-C (or SIGTERM) stops it."""
    import contextlib
    import secrets

    import uvicorn

    from otel_rl.gateway.vllm import free_ports
    from otel_rl.ui.link import web_view_line

    (port,) = free_ports(1)
    settings = ServeSettings(
        db=db, http_port=port, grpc_port=None, token=secrets.token_urlsafe(24), tokenizer=tokenizer
    )
    app = create_app(settings)
    console.print(
        web_view_line(app.state.ui_address, app.state.ui_url, db) + "; Ctrl-C stops it", soft_wrap=True
    )
    config = uvicorn.Config(app, host=settings.host, port=port, log_level="warning", access_log=False)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn stops cleanly, then raises the Ctrl-C it caught
        uvicorn_server(config, on_exit=app.state.queries.stop_all).run()
    console.print("web view stopped")
