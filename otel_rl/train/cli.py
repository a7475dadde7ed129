"""`otel-rl train`: online RL against live harnesses (default), offline RL on stored rollouts, or SFT."""

from pathlib import Path
from typing import Annotated

import typer


def train_command(
    config: Annotated[
        Path, typer.Option("--config", "-c", help="Training configuration (YAML, docs/training.md)")
    ],
    offline: Annotated[
        bool, typer.Option("--offline", help="RL on stored rollouts instead of live harnesses")
    ] = False,
    sft: Annotated[
        bool, typer.Option("--sft", help="Supervised fine-tuning on stored conversations")
    ] = False,
    where: Annotated[
        str | None,
        typer.Option(help="SQL predicate over the `rollouts` view choosing the rollouts to learn from"),
    ] = None,
    min_reward: Annotated[
        float | None, typer.Option(help="--sft: keep rollouts whose reward is at least this")
    ] = None,
    chats: Annotated[
        Path | None,
        typer.Option(help="--sft: a chat JSONL file (OpenAI fine-tuning format) instead of the store"),
    ] = None,
    db: Annotated[
        list[Path] | None,
        typer.Option(
            help="--offline / --sft: read this DuckDB file instead of `server.db` or the server; repeat it,"
            " or give a quoted glob ('parts/*.duckdb'), to read several stores as one"
        ),
    ] = None,
) -> None:
    """Train the policy: online (the harnesses run against the gateway while it learns), `--offline` from
    stored rollouts with importance correction, or `--sft` (rejection sampling with --min-reward)."""
    from rich.console import Console
    from rich.markup import escape
    from transformers.utils import logging as hf_logging

    from otel_rl.query import QueryError, warnings_as_lines
    from otel_rl.train.config import ConfigError, load_config
    from otel_rl.train.server_client import OnlineTrainingError

    hf_logging.disable_progress_bar()  # our own progress bars say what is happening
    console = Console()
    if offline and sft:
        raise typer.BadParameter("choose one of --offline and --sft", param_hint="--offline/--sft")
    if (where is not None or min_reward is not None) and not (offline or sft):
        raise typer.BadParameter("--where and --min-reward apply to --offline or --sft", param_hint="--where")
    if chats is not None and not sft:
        raise typer.BadParameter("--chats applies to --sft", param_hint="--chats")
    if db and not (offline or sft):
        raise typer.BadParameter("--db applies to --offline or --sft", param_hint="--db")
    flags = {"where": where, "min_reward": min_reward, "chats": chats and str(chats)}
    overrides = {"offline": {key: value for key, value in flags.items() if value is not None}}
    try:
        settings = load_config(config, overrides)
        if settings.backend == "verl":  # a cluster that does not answer stops the run before anything starts
            from otel_rl.train.verl.world import check_ray_answers, ray_cluster

            if cluster := ray_cluster(settings.ray_address):
                check_ray_answers(*cluster)
        if offline:
            from otel_rl.train.offline import offline_rl

            with warnings_as_lines(Console(stderr=True)):
                checkpoint = offline_rl(settings, console, db or ())
        elif sft:
            from otel_rl.train.offline import sft_from_traces

            with warnings_as_lines(Console(stderr=True)):
                checkpoint = sft_from_traces(settings, console, db or ())
        else:
            from otel_rl.train.online import run_online

            result = run_online(settings, console)
            checkpoint = f"{settings.output_dir} ({len(result.steps)} steps in {result.wall_s:.0f} s)"
    except (ConfigError, ValueError, QueryError, OnlineTrainingError) as error:
        console.print(f"[red]error:[/] {escape(str(error))}")
        raise typer.Exit(1) from None
    console.print(f"policy checkpoints: {checkpoint}")
