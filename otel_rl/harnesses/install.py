"""Installs a coding-agent CLI's pinned npm package once, into a cached folder outside any checkout."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from otel_rl.gateway.vllm_env import cache_root
from otel_rl.harnesses.recipe import HarnessCLI

INSTALL_TIMEOUT_S = 600


class InstallError(RuntimeError):
    """npm could not install a CLI."""


def install_dir(cli: HarnessCLI) -> Path:
    return cache_root() / "npm" / f"{cli.name}-{cli.version}"


def executable(cli: HarnessCLI) -> Path:
    """The installed CLI's executable (install it with `install`)."""
    return install_dir(cli) / "node_modules" / ".bin" / cli.binary


def install(cli: HarnessCLI) -> Path:
    """Install `cli.package@cli.version` with npm unless it is there already; returns its executable.

    npm installs into a staging folder that is renamed into place when complete, so that a concurrent or
    interrupted install never leaves a half-installed CLI where the next run would use it."""
    target = install_dir(cli)
    if executable(cli).exists():
        os.chmod(target, 0o755)  # installs before this one kept mkdtemp's 0700
        return executable(cli)
    npm = shutil.which("npm")
    if npm is None:
        raise InstallError(f"installing {cli.name} needs npm (and node), and npm is not on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".staging-{cli.name}-"))
    try:
        # --prefix with a package.json of its own keeps npm from walking up into an enclosing project.
        (staging / "package.json").write_text('{"private": true}\n')
        argv = [npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund", "--save-exact",
                f"{cli.package}@{cli.version}"]  # fmt: skip
        result = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
        if result.returncode != 0:
            raise InstallError(f"npm install {cli.package}@{cli.version} failed:\n{result.stderr[-4000:]}")
        if not (staging / "node_modules" / ".bin" / cli.binary).exists():
            raise InstallError(f"npm installed {cli.package}@{cli.version} but it has no `{cli.binary}`")
        # readable by whoever the coding sandbox runs the CLI as (nobody, when the caller is root)
        os.chmod(staging, 0o755)
        try:
            os.rename(staging, target)
        except OSError:
            if not executable(cli).exists():  # another install won the race: use its folder
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return executable(cli)
