"""`otel-rl export samples|sft`: training data from stored traces, with a report of what was kept and why."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from otel_rl.transforms.advantages import ESTIMATORS
from otel_rl.transforms.rewards import DEFAULT_TRUSTED_SOURCES, AggregationRule, RewardSpec

export_app = typer.Typer(help="Export training data from stored traces.", no_args_is_help=True)

Where = Annotated[str, typer.Option(help="SQL predicate over the `rollouts` view, e.g. \"split = 'train'\"")]
Db = Annotated[
    list[Path] | None,
    typer.Option(
        help="DuckDB file; repeat it, or give a quoted glob ('parts/*.duckdb'), to read several stores as one"
        " [env OTEL_RL_DB; default .otel_rl/otel_rl.duckdb]"
    ),
]
Server = Annotated[str | None, typer.Option(help="Read through this otel-rl server [env OTEL_RL_SERVER]")]
Token = Annotated[str | None, typer.Option(help="Server token [env OTEL_RL_TOKEN; else .otel_rl/token]")]
Tokenizer = Annotated[
    Path | None,
    typer.Option(help="Tokenizer folder (with chat template) for calls recorded without token ids"),
]
RewardName = Annotated[str, typer.Option(help="gen_ai.evaluation.name of the outcome reward")]
RewardRule = Annotated[
    AggregationRule, typer.Option(help="How several rewards of a rollout combine: last | mean | max | sum")
]
Trusted = Annotated[
    list[str] | None,
    typer.Option(
        "--trusted-source",
        help="otel_rl.reward.source values to trust (repeat it), or `any`: every source, and rewards sent "
        f"without one [default {' '.join(DEFAULT_TRUSTED_SOURCES)}]",
    ),
]
MissingReward = Annotated[
    float | None, typer.Option(help="Reward of a rollout that has none [default: drop the rollout]")
]
SkipErrorCalls = Annotated[
    bool,
    typer.Option(
        help="Keep rollouts with failed model calls (leaving those calls out) instead of excluding them"
    ),
]


def _reward(
    name: str, rule: AggregationRule, trusted_sources: list[str] | None, missing: float | None
) -> RewardSpec:
    return RewardSpec(name, rule, tuple(trusted_sources or DEFAULT_TRUSTED_SOURCES), missing)


def _build(
    where: str,
    db: list[Path] | None,
    server: str | None,
    token: str | None,
    tokenizer: Path | None,
    options: Any,
    *,
    messages: bool,
) -> tuple[Any, Any, Any]:
    """Read, build and report; errors become a one-line message and exit code 1."""
    from rich.console import Console

    from otel_rl.query import QueryError, query, warnings_as_lines
    from otel_rl.transforms.samples import build_samples, load_inputs, report_table

    console = Console(stderr=True)
    try:
        with console.status("reading rollouts, calls and rewards"), warnings_as_lines(console):
            run = partial(query, db=db, server=server, token=token)
            calls, rollouts, rewards = load_inputs(where, run, messages=messages)
        loaded = None
        if tokenizer is not None:
            from transformers import AutoTokenizer

            with console.status(f"loading the tokenizer from {tokenizer}"):
                loaded = AutoTokenizer.from_pretrained(str(tokenizer))
        with console.status(f"building samples from {rollouts.height} rollouts, {calls.height} calls"):
            samples, report = build_samples(calls, rollouts, rewards, tokenizer=loaded, options=options)
    except (QueryError, ValueError, OSError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None
    console.print(report_table(report))
    return samples, calls, report


@export_app.command("samples")
def samples_command(
    output: Annotated[Path, typer.Option("-o", "--output", help="Parquet file to write")],
    where: Where = "true",
    tokenizer: Tokenizer = None,
    db: Db = None,
    server: Server = None,
    token: Token = None,
    reward_name: RewardName = "outcome",
    reward_rule: RewardRule = "last",
    trusted_source: Trusted = None,
    missing_reward: MissingReward = None,
    estimator: Annotated[str, typer.Option(help=f"Advantage estimator: {' | '.join(ESTIMATORS)}")] = "grpo",
    max_prompt_length: Annotated[
        int | None, typer.Option(min=1, help="Drop segments with longer prompts")
    ] = None,
    max_response_length: Annotated[int | None, typer.Option(min=1, help="Truncate longer responses")] = None,
    policy_version: Annotated[
        int | None, typer.Option(help="Current policy version (for --max-staleness)")
    ] = None,
    max_staleness: Annotated[
        int | None, typer.Option(help="Drop segments older than this many versions")
    ] = None,
    skip_error_calls: SkipErrorCalls = False,
    drift_sample: Annotated[int, typer.Option(help="Exact-id calls to retokenize to measure drift")] = 64,
) -> None:
    """Token-aligned RL samples (ids, masks, logprobs, rewards, advantages) as Parquet (docs/samples.md)."""
    from otel_rl.transforms.export import write_parquet
    from otel_rl.transforms.limits import Limits
    from otel_rl.transforms.samples import SampleOptions

    if estimator not in ESTIMATORS:
        raise typer.BadParameter(f"use one of {', '.join(ESTIMATORS)}", param_hint="--estimator")
    options = SampleOptions(
        reward=_reward(reward_name, reward_rule, trusted_source, missing_reward),
        limits=Limits(max_prompt_length=max_prompt_length, max_response_length=max_response_length),
        estimator=estimator,  # type: ignore[arg-type]
        current_policy_version=policy_version,
        max_staleness=max_staleness,
        skip_error_calls=skip_error_calls,
        drift_sample=drift_sample,
    )
    samples, _, report = _build(where, db, server, token, tokenizer, options, messages=tokenizer is not None)
    if samples.height == 0:
        _nothing_to_write("samples", where, report)
    typer.echo(f"wrote {samples.height} samples to {write_parquet(samples, output)}")


def _nothing_to_write(what: str, where: str, report: Any) -> NoReturn:
    """Exit 1 with one line saying why an export has nothing to write, and the option that would change it
    (an empty file and exit 0 read as success to a script)."""
    if report.rollouts == 0:
        why = f"no rollout matches --where {where!r} (is --db the server's store, or is the server running?)"
    else:
        dropped = report.why_dropped()
        segments = ", ".join(f"{reason}: {n}" for reason, n in report.dropped_segments.items())
        why = f"of {report.rollouts} rollouts where {where}, dropped {dropped}" + (
            f"; segments dropped {segments}" if segments else ""
        )
    typer.echo(f"error: no {what} written: {why}", err=True)
    raise typer.Exit(1)


@export_app.command("sft")
def sft_command(
    output: Annotated[Path, typer.Option("-o", "--output", help="JSONL file to write")],
    where: Where = "true",
    min_reward: Annotated[
        float | None, typer.Option(help="Keep rollouts whose reward is at least this")
    ] = None,
    tokenizer: Tokenizer = None,
    db: Db = None,
    server: Server = None,
    token: Token = None,
    reward_name: RewardName = "outcome",
    reward_rule: RewardRule = "last",
    trusted_source: Trusted = None,
    missing_reward: MissingReward = None,
    skip_error_calls: SkipErrorCalls = False,
) -> None:
    """OpenAI chat fine-tuning JSONL (messages + tools), one line per trajectory segment of a kept rollout."""
    from otel_rl.transforms.export import sft_records, write_jsonl
    from otel_rl.transforms.samples import SampleOptions

    options = SampleOptions(
        reward=_reward(reward_name, reward_rule, trusted_source, missing_reward),
        skip_error_calls=skip_error_calls,
        drift_sample=0,
    )
    samples, calls, report = _build(where, db, server, token, tokenizer, options, messages=True)
    if samples.height == 0:
        _nothing_to_write("conversations", where, report)
    try:
        records = sft_records(samples, calls, min_reward)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if not records:
        best = samples["reward"].max()
        typer.echo(
            f"error: no conversations written: the best reward where {where} is {best}, under --min-reward"
            f" {min_reward}",
            err=True,
        )
        raise typer.Exit(1)
    typer.echo(f"wrote {len(records)} conversations to {write_jsonl(records, output)}")
