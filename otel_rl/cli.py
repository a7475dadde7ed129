"""The `otel-rl` command: one sub-command per component, registered here."""

import typer

from otel_rl.extras import register

app = typer.Typer(
    name="otel-rl",
    help="OpenTelemetry-native trace-to-training pipeline for agent reinforcement learning.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="markdown",
)

# Each component defines its command (or sub-app) next to its code; heavy imports stay inside them. Each
# names the extra it needs: a base install (`pip install otel-rl`, what a harness imports) shows a stand-in
# saying what to install instead. Registrations (one line each):
register(app, "serve", "otel_rl.serve_cli:serve", extra="server")
register(app, "sql", "otel_rl.query:sql_command", extra="server")
register(app, "model", "otel_rl.tinymodel:model_app", extra="train")
register(app, "vllm", "otel_rl.gateway.vllm_env:vllm_app", extra="server")
register(app, "export", "otel_rl.transforms.cli:export_app", extra="server")
register(app, "store", "otel_rl.store.cli:store_app", extra="server")
register(app, "archive", "otel_rl.archive_cli:archive_command", extra="server")
register(app, "train", "otel_rl.train.cli:train_command", extra="train")
register(app, "demo", "otel_rl.demo_cli:demo_app", extra="all")
register(app, "harness", "otel_rl.harnesses.cli:harness_app", extra="server")
register(app, "rollouts", "otel_rl.train.rollouts_cli:rollouts_app", extra="server")
register(app, "tasks", "otel_rl.coding_app.cli:tasks_app", extra="server")
register(app, "sandbox", "otel_rl.coding_app.cli:sandbox_app", extra="server")
register(app, "grade", "otel_rl.coding_app.cli:grade_command", extra="server")
