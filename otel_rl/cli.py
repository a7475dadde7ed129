"""The `otel-rl` command: one sub-command per component, registered here."""

import typer

app = typer.Typer(
    name="otel-rl",
    help="OpenTelemetry-native trace-to-training pipeline for agent reinforcement learning.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

# Each component defines its command (or sub-app) next to its code; heavy imports stay inside them.
# Registrations (one line each):
