"""`otel-rl serve`: one process with the OTLP receivers (HTTP and gRPC), the query API and rewards."""

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

DEFAULT_DB = Path(".otel_rl") / "otel_rl.duckdb"


def _default_db() -> Path:
    return Path(os.environ.get("OTEL_RL_DB") or DEFAULT_DB)


@dataclass
class ServeSettings:
    """Everything `otel-rl serve` is configured with (flags, else environment variables, else defaults)."""

    db: Path = field(default_factory=_default_db)
    host: str = "127.0.0.1"
    http_port: int = 4318
    grpc_port: int | None = 4317  # None: no gRPC receiver
    token: str | None = None  # None: OTEL_RL_TOKEN, else .otel_rl/token, else a new one written there
    max_body_bytes: int = 64 * 1024 * 1024
    # Gateway (docs/gateway.md): a local vLLM started for this model folder, and/or running vLLM servers.
    model: Path | None = None
    lora_rank: int | None = None  # the local vLLM loads LoRA adapters up to this rank (`lora_adapter`)
    vllm: tuple[str, ...] = ()
    forward_otlp: str | None = None  # also send the gateway's spans to this OTLP/HTTP traces endpoint
    split_sampling: dict | None = None  # {"train": {...}, "val": {...}}; None: the gateway's defaults
    upstream_timeout_s: float = 600.0  # one model call through the gateway
    drain_timeout_s: float = 30.0  # how long a reload lets calls in flight finish before aborting them


def create_app(settings: ServeSettings):  # noqa: ANN201 - FastAPI, imported lazily to keep the CLI fast
    """The server's FastAPI app; opens the store now, starts gRPC with the app and closes both after it."""
    from fastapi import FastAPI

    from otel_rl.auth import Auth, admin_token
    from otel_rl.collector.http import collector_router
    from otel_rl.collector.rewards import rewards_router
    from otel_rl.gateway.routes import ModelCallRoutes, gateway_router
    from otel_rl.query_api import query_router
    from otel_rl.store import Store

    store = Store(settings.db)
    token, token_source = admin_token(settings.token)
    auth = Auth(store, token)
    gateway, local_vllm = _gateway(settings, store, auth)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        grpc_server = None
        if settings.grpc_port is not None:
            from otel_rl.collector.grpc import start_grpc_server

            grpc_server, app.state.grpc_port = start_grpc_server(
                store, auth, host=settings.host, port=settings.grpc_port
            )
        if local_vllm is not None:
            local_vllm.start()
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()
            if local_vllm is not None:
                local_vllm.stop()
            if grpc_server is not None:
                grpc_server.stop(grace=5).wait()
            store.close()

    # FastAPI's own OpenTelemetry off: the server is where telemetry ends up, and tracing its own requests
    # would send every export's spans back to itself (and asked for the providers on every request: ~2% of
    # a gateway call's CPU).
    no_telemetry = {"tracing": False, "metrics": False, "logs": False}
    app = FastAPI(title="otel-rl", lifespan=lifespan, telemetry=no_telemetry)
    app.state.settings = settings
    app.state.store = store
    app.state.auth = auth
    app.state.token_source = token_source
    app.include_router(collector_router(store, auth, max_body_bytes=settings.max_body_bytes))
    app.include_router(query_router(store, auth))
    app.include_router(rewards_router(store, auth))
    app.state.gateway = gateway
    app.include_router(gateway_router(gateway))
    app.add_middleware(ModelCallRoutes, gateway=gateway)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict:
        return {"status": "ok", "db": str(store.path), "views": store.views}

    return app


def _gateway(settings: ServeSettings, store, auth):  # noqa: ANN001, ANN202 - lazily imported types
    """The gateway over the configured vLLM servers, and the local vLLM server to start for `--model`."""
    from otel_rl.gateway.proxy import Gateway
    from otel_rl.gateway.settings import GatewaySettings
    from otel_rl.gateway.vllm import VLLMServer

    local = VLLMServer(settings.model, lora_rank=settings.lora_rank) if settings.model is not None else None
    servers = ((local.url,) if local else ()) + tuple(settings.vllm)
    options = {"split_sampling": settings.split_sampling} if settings.split_sampling is not None else {}
    gateway_settings = GatewaySettings(
        servers=servers,
        forward_otlp=settings.forward_otlp,
        upstream_timeout_s=settings.upstream_timeout_s,
        drain_timeout_s=settings.drain_timeout_s,
        **options,
    )
    return Gateway(gateway_settings, auth=auth, store=store), local


def serve(
    db: Annotated[
        Path | None, typer.Option(help="DuckDB file [env OTEL_RL_DB; default .otel_rl/otel_rl.duckdb]")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to bind")] = "127.0.0.1",
    http_port: Annotated[int, typer.Option(help="OTLP/HTTP, query, rewards (and gateway) port")] = 4318,
    grpc_port: Annotated[int, typer.Option(help="OTLP/gRPC port")] = 4317,
    token: Annotated[
        str | None,
        typer.Option(help="Admin bearer token [env OTEL_RL_TOKEN; else .otel_rl/token, made if absent]"),
    ] = None,
    model: Annotated[
        Path | None, typer.Option(help="Start a local vLLM server for this model folder behind the gateway")
    ] = None,
    lora_rank: Annotated[
        int | None,
        typer.Option(help="Let the local vLLM load LoRA adapters up to this rank (8, 16, 32, ...)"),
    ] = None,
    vllm: Annotated[
        list[str] | None, typer.Option(help="URL of a running vLLM server behind the gateway (repeatable)")
    ] = None,
    forward_otlp: Annotated[
        str | None, typer.Option(help="Also send the gateway's spans to this OTLP/HTTP traces endpoint")
    ] = None,
    split_sampling: Annotated[
        str | None,
        typer.Option(
            help='Sampling forced per split, JSON: \'{"train": {"temperature": 1.0}, "val": {...}}\''
        ),
    ] = None,
    upstream_timeout: Annotated[
        float, typer.Option(help="Seconds a model call through the gateway may wait for vLLM")
    ] = 600.0,
    drain_timeout: Annotated[
        float, typer.Option(help="Seconds a weight reload lets calls in flight finish before aborting them")
    ] = 30.0,
) -> None:
    """Run the server: OTLP receivers (HTTP and gRPC), the SQL query API and rewards, over one DuckDB file."""
    import uvicorn
    from rich.console import Console

    settings = ServeSettings(
        db=db or _default_db(),
        host=host,
        http_port=http_port,
        grpc_port=grpc_port,
        token=token,
        model=model,
        lora_rank=lora_rank,
        vllm=tuple(vllm or ()),
        forward_otlp=forward_otlp,
        split_sampling=_json_option("--split-sampling", split_sampling),
        upstream_timeout_s=upstream_timeout,
        drain_timeout_s=drain_timeout,
    )
    app = create_app(settings)
    console = Console(stderr=True)
    console.print(
        f"otel-rl serving [bold]{settings.db}[/]: OTLP/HTTP, query, rewards on http://{host}:{http_port}, "
        f"OTLP/gRPC on {host}:{grpc_port}; admin token from {app.state.token_source}"
    )
    servers = ", ".join(server.url for server in app.state.gateway.pool.servers) or "none (--model / --vllm)"
    local = f" (starting vLLM for {settings.model})" if settings.model else ""
    console.print(f"gateway on http://{host}:{http_port}/v1 → vLLM {servers}{local}")
    # uvicorn turns SIGINT/SIGTERM into a clean shutdown; the lifespan then stops gRPC and closes the store.
    uvicorn.run(app, host=host, port=http_port, log_level="warning", access_log=False)


def _json_option(flag: str, value: str | None) -> dict | None:
    import json

    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as error:
        raise typer.BadParameter(f"not JSON: {error}", param_hint=flag) from None
    if not isinstance(parsed, dict):
        raise typer.BadParameter("must be a JSON object", param_hint=flag)
    return parsed
