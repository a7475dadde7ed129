"""Serve the web view over a finished run's store until Ctrl-C (the end of `otel-rl demo`)."""

import contextlib
import secrets
from pathlib import Path

from rich.console import Console


def serve_until_interrupted(db: Path, *, tokenizer: Path | None, console: Console) -> None:
    """An `otel-rl serve` app over `db` on a free loopback port (no gRPC, no vLLM behind the gateway), with a
    new admin token; writes the view's link beside the store (link.py), prints where, and returns once
    Ctrl-C (or SIGTERM) stops it."""
    import uvicorn

    from otel_rl.gateway.vllm import free_ports
    from otel_rl.server import ServeSettings, create_app, uvicorn_server
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
