"""The `otel-rl demo` group: `otel-rl demo [OPTIONS]` runs the calculator demo as before, and
`otel-rl demo coding [OPTIONS]` the coding demo (otel_rl/coding_app/demo.py)."""

import inspect

import typer

from otel_rl.coding_app.demo import coding_command
from otel_rl.demo import demo_command


def _calculator(ctx: typer.Context, **options: object) -> None:
    if ctx.invoked_subcommand is None:  # `otel-rl demo coding` runs the coding demo only
        demo_command(**options)


# The group's own options are demo_command's, read from its signature: a flag added there appears here.
_calculator.__signature__ = inspect.signature(demo_command).replace(
    parameters=[
        inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context),
        *inspect.signature(demo_command).parameters.values(),
    ]
)
_calculator.__annotations__ = {"ctx": typer.Context, **demo_command.__annotations__}
_calculator.__doc__ = demo_command.__doc__

demo_app = typer.Typer(rich_markup_mode="markdown")
demo_app.callback(invoke_without_command=True)(_calculator)
demo_app.command("coding")(coding_command)
