"""The extras `otel-rl` sub-commands need, and the stand-in a lighter install shows for a missing one."""

from functools import cache
from importlib import import_module, metadata

import typer
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

DISTRIBUTION = "otel-rl"
# A stand-in takes whatever it is given (`otel-rl export samples -o x.parquet`, `--help`) and says one thing.
ANY_ARGUMENTS = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


@cache
def missing(extra: str) -> tuple[str, ...]:
    """The requirements of `extra` (its nested extras' too) that this environment does not satisfy. Empty
    when otel-rl runs without installed metadata (a source tree on PYTHONPATH): imports then decide."""
    try:
        requirements = [Requirement(text) for text in metadata.requires(DISTRIBUTION) or ()]
    except metadata.PackageNotFoundError:
        return ()
    absent: list[str] = []
    for requirement in requirements:
        if requirement.marker is None or not requirement.marker.evaluate({"extra": extra}):
            continue  # a base requirement, or another extra's
        if canonicalize_name(requirement.name) == DISTRIBUTION:
            absent += [name for nested in sorted(requirement.extras) for name in missing(nested)]
            continue
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            absent.append(requirement.name)
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            absent.append(f"{requirement.name}{requirement.specifier} ({version} installed)")
    return tuple(dict.fromkeys(absent))


def register(app: typer.Typer, name: str, target: str, *, extra: str) -> None:
    """Add `target` (`module:attribute`, a command function or a Typer sub-app) to `app` as `name`; where
    the extra it needs is not installed, a stand-in that says how to install it (its module is not imported:
    it may import that extra's packages at the top)."""
    absent = missing(extra)
    if absent:
        install = f"pip install 'otel-rl[{extra}]'"
        stand_in = app.command(
            name, help=f"(needs the {extra} extra: {install})", context_settings=ANY_ARGUMENTS
        )

        @stand_in
        def needs_extra() -> None:
            typer.echo(
                f"otel-rl {name} needs the {extra} extra: {install} (missing: {', '.join(absent)})", err=True
            )
            raise typer.Exit(1)

        return
    module, attribute = target.split(":")
    found = getattr(import_module(module), attribute)
    if isinstance(found, typer.Typer):
        app.add_typer(found, name=name)
    else:
        app.command(name)(found)
