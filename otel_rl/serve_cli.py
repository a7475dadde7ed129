"""`otel-rl serve`: its flags, read into ServeSettings, then the banner and the HTTP server."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from otel_rl.archive_api import ScheduleSettings
from otel_rl.auth import DEFAULT_KEY_LIFETIME_S
from otel_rl.connections import ConnectionLimits
from otel_rl.server import ServeSettings, create_app, uvicorn_config, uvicorn_server
from otel_rl.store.connection import default_db

if TYPE_CHECKING:
    from pydantic import ValidationError

    from otel_rl.gateway.limits import RequestLimits

CONNECTIONS = ConnectionLimits()  # the defaults of its flags


def serve(
    db: Annotated[
        Path | None, typer.Option(help="DuckDB file [env OTEL_RL_DB; default .otel_rl/otel_rl.duckdb]")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to bind")] = "127.0.0.1",
    http_port: Annotated[int, typer.Option(help="OTLP/HTTP, query, rewards (and gateway) port")] = 4318,
    grpc_port: Annotated[int, typer.Option(help="OTLP/gRPC port")] = 4317,
    token: Annotated[
        str | None,
        typer.Option(
            help="Admin bearer token (visible in `ps`: prefer --token-file) [env OTEL_RL_TOKEN; else "
            "OTEL_RL_TOKEN_FILE; else .otel_rl/token, made if absent]"
        ),
    ] = None,
    token_file: Annotated[
        Path | None, typer.Option(help="Read the admin token from this file [env OTEL_RL_TOKEN_FILE]")
    ] = None,
    public_docs: Annotated[
        bool, typer.Option(help="Serve /docs, /redoc and /openapi.json without the admin token")
    ] = False,
    public_metrics: Annotated[
        bool, typer.Option(help="Serve /metrics without the admin token (else scrape with it as a bearer)")
    ] = False,
    query_timeout: Annotated[
        float, typer.Option(min=0.001, help="Seconds a /v1/query statement may run before it is stopped")
    ] = 10.0,
    query_max_bytes: Annotated[
        int, typer.Option(min=1, help="Largest /v1/query result, in bytes of Arrow data")
    ] = 256 * 1024 * 1024,
    query_concurrency: Annotated[
        int, typer.Option(min=1, help="/v1/query statements running at once (more wait briefly, then 429)")
    ] = 4,
    model: Annotated[
        Path | None, typer.Option(help="Start a local vLLM server for this model folder behind the gateway")
    ] = None,
    lora_rank: Annotated[
        int | None,
        typer.Option(help="Let the local vLLM load LoRA adapters up to this rank (8, 16, 32, ...)"),
    ] = None,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Context of the local vLLM, prompt plus answer, in tokens (default: what --model's config "
            "declares; never more)",
        ),
    ] = None,
    replicas: Annotated[
        int,
        typer.Option(
            min=1,
            help="Local vLLM servers of --model behind the gateway, each on its own GPUs (else CPU cores), "
            "balanced by calls in flight and reloaded together",
        ),
    ] = 1,
    vllm_arg: Annotated[
        list[str] | None,
        typer.Option(
            help="One of vLLM's own flags for the local servers, e.g. --vllm-arg=--tensor-parallel-size=2 "
            "(repeatable; replaces ours of the same name, e.g. --vllm-arg=--dtype=bfloat16); vLLM's parser "
            "checks them before anything starts",
        ),
    ] = None,
    vllm: Annotated[
        list[str] | None,
        typer.Option(
            help="A running vLLM server behind the gateway: http://HOST:PORT, or its OpenAI base URL "
            "http://HOST:PORT/v1 (repeatable)"
        ),
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
    request_limits: Annotated[
        str | None,
        typer.Option(
            help='Bounds on what one model call may ask for, JSON: \'{"max_n": 4, "allowed_media_urls": '
            '["https://images.example.com"]}\' (the others keep their defaults; docs/security.md)'
        ),
    ] = None,
    upstream_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds a model call may wait for vLLM (also for a server that is down to come back)"
        ),
    ] = 600.0,
    tokenizer: Annotated[
        Path | None,
        typer.Option(help="A model folder whose tokenizer decodes tokens in the web view (default: --model)"),
    ] = None,
    drain_timeout: Annotated[
        float, typer.Option(help="Seconds a weight reload lets calls in flight finish before aborting them")
    ] = 30.0,
    colocated: Annotated[
        bool,
        typer.Option(
            help="Rollouts and training on the same devices: at each update vLLM sleeps (weights and KV cache"
            " released) while the trainer runs, and wakes with the new weights; calls wait meanwhile"
        ),
    ] = False,
    archive_after_days: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Move raw rows received more than this many days ago (whole UTC days) into the store's"
            " Parquet archive: at start, then hourly (docs/query.md#the-archive)",
        ),
    ] = None,
    retain_days: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Delete data received more than this many days ago (archived days and raw rows): at start,"
            " then hourly",
        ),
    ] = None,
    retain_bytes: Annotated[
        str | None,
        typer.Option(
            help="Delete the oldest archived days while the archive is larger than this (500MB, 20GiB...):"
            " at start, then hourly"
        ),
    ] = None,
    rollout_key_lifetime: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="Seconds a rollout key works after it is issued (its attempt's end revokes it sooner)",
        ),
    ] = DEFAULT_KEY_LIFETIME_S,
    print_ui_link: Annotated[
        bool,
        typer.Option(
            help="Print the web view's link, which holds the admin token, to stdout (else it is only written"
            " beside the store, mode 600)"
        ),
    ] = False,
    max_connections: Annotated[
        int,
        typer.Option(
            min=1,
            help="HTTP connections open at once; more are answered 503 (at most half the open-file limit)",
        ),
    ] = CONNECTIONS.max_connections,
    max_connections_per_client: Annotated[
        int, typer.Option(min=1, help="HTTP connections one client address may hold; more are answered 503")
    ] = CONNECTIONS.max_connections_per_client,
    header_timeout: Annotated[
        float, typer.Option(min=0.001, help="Seconds a client has to send a request's headers (else 408)")
    ] = CONNECTIONS.header_timeout_s,
    body_timeout: Annotated[
        float,
        typer.Option(min=0.001, help="Seconds a request body may go without a byte before it is dropped"),
    ] = CONNECTIONS.body_timeout_s,
    shutdown_timeout: Annotated[
        float,
        typer.Option(min=0.0, help="Seconds after SIGTERM/SIGINT that requests in flight may take to finish"),
    ] = 10.0,
) -> None:
    """Run the server: OTLP receivers (HTTP and gRPC), the SQL query API and rewards, over one DuckDB file."""
    from pydantic import ValidationError
    from rich.console import Console

    from otel_rl.ui.link import web_view_line

    if max_model_len is not None and model is None:  # it sizes the local vLLM only
        raise typer.BadParameter(
            "needs --model: it is the context of the vLLM started for it", param_hint="--max-model-len"
        )
    if model is None and (replicas != 1 or vllm_arg):
        flag = "--replicas" if replicas != 1 else "--vllm-arg"
        raise typer.BadParameter("needs --model: it sets up the vLLM started for it", param_hint=flag)
    try:  # checked before the store opens
        settings = ServeSettings(
            db=db or default_db(),
            host=host,
            http_port=http_port,
            grpc_port=grpc_port,
            token=token,
            token_file=token_file,
            public_docs=public_docs,
            public_metrics=public_metrics,
            query_timeout_s=query_timeout,
            query_max_bytes=query_max_bytes,
            query_concurrency=query_concurrency,
            model=model,
            lora_rank=lora_rank,
            max_model_len=max_model_len,
            replicas=replicas,
            vllm_args=tuple(vllm_arg or ()),
            vllm=tuple(vllm or ()),
            forward_otlp=forward_otlp,
            split_sampling=_json_option("--split-sampling", split_sampling),
            request_limits=_request_limits(request_limits),
            upstream_timeout_s=upstream_timeout,
            drain_timeout_s=drain_timeout,
            colocated=colocated,
            tokenizer=tokenizer,
            archive=ScheduleSettings.from_flags(archive_after_days, retain_days, retain_bytes),
            rollout_key_lifetime_s=rollout_key_lifetime,
            connections=ConnectionLimits(
                max_connections=max_connections,
                max_connections_per_client=max_connections_per_client,
                header_timeout_s=header_timeout,
                body_timeout_s=body_timeout,
            ),
            shutdown_timeout_s=shutdown_timeout,
        )
    except ValidationError as error:
        raise typer.BadParameter(_problems(error, flags=True)) from None
    from otel_rl.gateway.vllm_env import VLLMEnvironmentMissing
    from otel_rl.store.wal import StoreDamaged

    try:
        app = create_app(settings)
    except StoreDamaged as damaged:  # what is lost and the commands to run, without a traceback
        Console(stderr=True).print(f"[red]error:[/] {damaged}")
        raise typer.Exit(1) from None
    except VLLMEnvironmentMissing as missing:  # --vllm-arg is checked by vLLM's parser, in its environment
        Console(stderr=True).print(f"[red]error:[/] {missing}")
        raise typer.Exit(1) from None
    except ValidationError as error:  # the gateway's settings: each message names its flag (--vllm)
        raise typer.BadParameter(_problems(error)) from None
    except ValueError as error:  # its message starts with the flag it is about (--token-file)
        raise typer.BadParameter(str(error)) from None
    console = Console(stderr=True)
    console.print(
        f"otel-rl serving [bold]{settings.db}[/]: OTLP/HTTP, query, rewards on http://{host}:{http_port}, "
        f"OTLP/gRPC on {host}:{grpc_port}; admin token from {app.state.token_source}"
    )
    servers = ", ".join(server.url for server in app.state.gateway.pool.servers) or "none (--model / --vllm)"
    copies = f"{settings.replicas} replicas of " if settings.replicas > 1 else ""
    local = f" (starting vLLM for {copies}{settings.model})" if settings.model else ""
    console.print(f"gateway on http://{host}:{http_port}/v1 → vLLM {servers}{local}")
    console.print(web_view_line(app.state.ui_address, app.state.ui_url, settings.db), soft_wrap=True)
    if print_ui_link:  # asked for: on stdout, apart from the banner and the log
        typer.echo(app.state.ui_url)
    # uvicorn turns SIGINT/SIGTERM into a clean shutdown; the lifespan then stops gRPC and closes the store.
    config = uvicorn_config(app, settings)
    # Bound before the lifespan starts vLLM, which takes free ports of its own: one could be this one
    listening = config.bind_socket()
    uvicorn_server(config, on_exit=app.state.queries.stop_all).run(sockets=[listening])


def _request_limits(value: str | None) -> "RequestLimits | None":
    from pydantic import ValidationError

    from otel_rl.gateway.limits import RequestLimits

    given = _json_option("--request-limits", value)
    if given is None:
        return None
    try:
        return RequestLimits.model_validate(given)
    except ValidationError as error:
        raise typer.BadParameter(_problems(error), param_hint="--request-limits") from None


def _problems(error: "ValidationError", *, flags: bool = False) -> str:
    """Each problem of a settings object, on one line: `field: what is wrong`; with `flags`, the field is
    named by its flag (_flag). A problem of the whole object (no field) is its message alone."""
    lines = []
    for problem in error.errors():
        loc, message = problem["loc"], problem["msg"].removeprefix("Value error, ")
        field = (_flag(loc) if flags else ".".join(map(str, loc))) if loc else ""
        lines.append(f"{field}: {message}" if field else message)
    return "; ".join(lines)


def _flag(loc: tuple) -> str:
    """The flag that sets a ServeSettings field (or a field of the settings it holds): the field's name in
    dashes, without the unit suffix `_s`."""
    return "--" + str(loc[-1]).removesuffix("_s").replace("_", "-")


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
