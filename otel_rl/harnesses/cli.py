"""`otel-rl harness install <cli>` and `otel-rl harness <cli>` (a rollout's command under the controller)."""

import os
from typing import Annotated

import typer

from otel_rl.harnesses import CLIS
from otel_rl.harnesses.install import InstallError, install
from otel_rl.harnesses.recipe import HarnessCLI, HarnessError

harness_app = typer.Typer(
    help="Coding-agent CLIs (Codex, Claude Code, Qwen Code, opencode) as rollout harnesses "
    "(docs/controller.md).",
    no_args_is_help=True,
)


@harness_app.command("install")
def install_command(
    name: Annotated[str, typer.Argument(help=f"one of: {', '.join(CLIS)}")],
) -> None:
    """Install the CLI's pinned npm package into ~/.cache/otel-rl/npm/ (once; later runs reuse it)."""
    cli = _cli(name)
    try:
        typer.echo(install(cli))
    except InstallError as error:
        raise typer.BadParameter(str(error)) from None


def _cli(name: str) -> HarnessCLI:
    if name not in CLIS:
        raise typer.BadParameter(f"unknown CLI {name!r}: use one of {', '.join(CLIS)}")
    return CLIS[name]


def _rollout_command(cli: HarnessCLI) -> None:
    def command(
        model: Annotated[
            str | None, typer.Option(help="the model name; default: the first the gateway lists")
        ] = None,
    ) -> None:
        # Imported here: the OTel SDK and httpx are not needed by `otel-rl --help` or `harness install`.
        from otel_rl.harnesses.run import run_rollout

        try:
            outcome = run_rollout(cli, os.environ, model=model)
        except HarnessError as error:
            typer.echo(f"otel-rl harness {cli.name}: {error}", err=True)
            raise typer.Exit(2) from None
        verdict = {True: "check passed", False: "check failed", None: "graded outside the sandbox"}
        typer.echo(
            f"otel-rl harness {cli.name}: exit {outcome.exit_code}"
            f"{' (timed out)' if outcome.timed_out else ''}, {verdict[outcome.passed]}",
            err=True,
        )
        # A timeout is the agent's failure to finish (a bad answer, reward from the check); any other
        # non-zero exit is the CLI's own failure: the rollout's status is `error`.
        if outcome.exit_code != 0 and not outcome.timed_out:
            raise typer.Exit(outcome.exit_code if outcome.exit_code > 0 else 128 - outcome.exit_code)

    command.__doc__ = (
        f"Run one rollout of {cli.name} {cli.version} on the task in OTEL_RL_TASK: a fresh copy of the "
        "task's repository, the CLI pointed at the gateway and the collector, then the task's check as the "
        "reward; a coding task (docs/coding.md) is worked on in place, its reward left to the grader."
    )
    harness_app.command(cli.name)(command)


for _cli_recipe in CLIS.values():
    _rollout_command(_cli_recipe)
