"""A package's public names imported on first use, so that `otel-rl` sub-commands stay fast to start."""

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The package's module `__getattr__`: `exports` maps each public name to the module that defines it."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            module = import_module(exports[name])
        except ModuleNotFoundError as error:
            if error.name is None or error.name.split(".")[0] == "otel_rl":
                raise
            # A base install (`pip install otel-rl`) has the SDK only; say what brings the rest.
            raise ModuleNotFoundError(
                f"{package}.{name} needs {error.name!r}, which this install lacks: the server, the "
                "transforms and the trainer come with extras: pip install 'otel-rl[server]' (or [train], "
                "[all])",
                name=error.name,
            ) from error
        return getattr(module, name)

    return __getattr__
