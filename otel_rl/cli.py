"""The `otel-rl` command: one sub-command per component, registered here."""

import typer

from otel_rl.demo import demo_command
from otel_rl.gateway.vllm import vllm_app
from otel_rl.query import sql_command
from otel_rl.server import serve
from otel_rl.store.cli import store_app
from otel_rl.tinymodel import model_app
from otel_rl.train.cli import train_command
from otel_rl.transforms.cli import export_app

app = typer.Typer(
    name="otel-rl",
    help="OpenTelemetry-native trace-to-training pipeline for agent reinforcement learning.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="markdown",
)

# Each component defines its command (or sub-app) next to its code; heavy imports stay inside them.
# Registrations (one line each):
app.command("serve")(serve)
app.command("sql")(sql_command)
app.add_typer(model_app, name="model")
app.add_typer(vllm_app, name="vllm")
app.add_typer(export_app, name="export")
app.add_typer(store_app, name="store")
app.command("train")(train_command)
app.command("demo")(demo_command)
