"""What the GPU check carries to the GPU machine, built here: wheels, at requirements.lock's versions, of
every package its imports need that the machine lacks; and, for the proof run on CPU, a stand-in machine.

    carry.py wheels DEST --python-version 3.12|local   wheels into DEST/wheels, DEST/machine.txt; sizes
    carry.py machine DEST    a cached environment of DEST/machine.txt alone (the machine's packages at the
                             lock's versions); prints its python

Which packages: the check runs once here, in this environment (tiny model, CPU), and every module it imports
is traced to the distribution that installed it; those the machine has (machine_packages.txt) stay behind.
"""

import argparse
import fcntl
import hashlib
import importlib.metadata
import os
import runpy
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LOCK = ROOT / "requirements.lock"
# verl 0.9.1 requires transformers<5.11; the machine's 5.17 is outside that (and the lock's 5.10.4 refuses the
# machine's tokenizers 0.23.2), so both travel at the lock's versions. torch stays the machine's: too big.
ALWAYS_CARRIED = ("transformers", "tokenizers")
CARRY_LIMIT = 64 * 2**20  # what the device tool takes to the machine: working tree and carried paths together
# pip matches manylinux tags exactly: every glibc from CentOS 7's (2.17) to today's.
READY = ".otel-rl-ready"  # written last: a cached folder without it is what an interrupted build left
PLATFORMS = ["manylinux2014_x86_64", *(f"manylinux_2_{n}_x86_64" for n in range(17, 40)), "linux_x86_64"]


def cache_root() -> Path:
    return Path(os.environ.get("OTEL_RL_CACHE", "~/.cache/otel-rl")).expanduser()


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold `folder`'s lock file: one process builds a cached folder, the others wait and use it."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with folder.with_name(folder.name + ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def lock_versions() -> dict[str, str]:
    """requirements.lock as {canonical name: "name==version"}."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name = line.split("==")[0].strip()
            pins[canonicalize_name(name)] = line.strip()
    return pins


def machine_names() -> set[str]:
    lines = (HERE / "machine_packages.txt").read_text().splitlines()
    return {canonicalize_name(line) for line in lines if line and not line.startswith("#")}


def import_closure() -> set[str]:
    """The distributions whose files the tiny CPU check imports, run in this process (the stand-in for Ray
    first on the path, as on the machine)."""
    sys.path.insert(0, str(HERE / "fixtures"))
    argv = sys.argv
    sys.argv = [str(HERE / "verl_engine.py"), "--cpu", "--tiny"]
    try:
        runpy.run_path(str(HERE / "verl_engine.py"), run_name="__main__")
    finally:
        sys.argv = argv
    owners = {}  # normpath, not resolve: a syscall for each of the environment's files takes minutes
    for dist in importlib.metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        owners.update((os.path.normpath(dist.locate_file(file)), name) for file in dist.files or ())
    imported = {
        os.path.normpath(f) for m in list(sys.modules.values()) if (f := getattr(m, "__file__", None))
    }
    return {owners[path] for path in imported if path in owners}


def fetch_wheel(requirement: str, python_version: str) -> Path:
    """One wheel of `requirement` for the target interpreter (a pure-Python one built here if the index has
    only an sdist), fetched once into the cache."""
    if python_version == "local":
        target = "local-" + hashlib.sha256(sys.version.encode()).hexdigest()[:12]
    else:
        target = "cp" + python_version.replace(".", "")
    folder = cache_root() / f"gpu-wheels-{target}" / requirement
    with locked(folder):
        if not (folder / READY).is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            _download(requirement, folder, python_version)
            (folder / READY).write_text(requirement)
    [wheel] = folder.glob("*.whl")
    return wheel


def _download(requirement: str, dest: Path, python_version: str) -> None:
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    target = []
    if python_version != "local":
        tag = python_version.replace(".", "")
        target = ["--python-version", python_version, "--implementation", "cp", "--abi", f"cp{tag}"]
        target += ["--abi", "abi3", "--abi", "none", *(arg for p in PLATFORMS for arg in ("--platform", p))]
    download = [*pip, "download", "--no-deps", "--only-binary=:all:", *target, "-d", dest, requirement]
    if subprocess.run(download, capture_output=True).returncode != 0:
        # Only an sdist on the index (antlr4-python3-runtime, say): build it, and keep it only if it is pure.
        subprocess.run([*pip, "wheel", "--no-deps", "-w", dest, requirement], check=True, capture_output=True)
    [wheel] = dest.glob("*.whl")
    _, _, _, tags = parse_wheel_filename(wheel.name)
    if python_version != "local" and not any(t.platform == "any" or "manylinux" in t.platform for t in tags):
        raise SystemExit(f"{requirement}: no wheel for CPython {python_version} on x86-64 Linux")


def build_wheels(dest: Path, python_version: str) -> None:
    pins = lock_versions()
    needed = import_closure() | set(ALWAYS_CARRIED)
    machine = machine_names()
    carried = sorted(name for name in needed if name not in machine or name in ALWAYS_CARRIED)
    missing = [name for name in carried if name not in pins]
    if missing:
        raise SystemExit(f"imported but not in requirements.lock: {missing}")
    wheels = dest / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    for name in carried:
        shutil.copy2(fetch_wheel(pins[name], python_version), wheels)
    provided = sorted(pins[name] for name in needed - set(carried) if name in pins)
    (dest / "machine.txt").write_text("".join(f"{line}\n" for line in provided))
    carried_bytes = sum(wheel.stat().st_size for wheel in wheels.iterdir())
    tree = working_tree_bytes()
    mib = carried_bytes / 2**20
    print(f"carried: {len(carried)} wheels, {mib:.1f} MiB: {' '.join(pins[n] for n in carried)}")
    print(f"from the machine: {' '.join(provided)}")
    print(
        f"total carried size: {(carried_bytes + tree) / 2**20:.1f} MiB (wheels {carried_bytes / 2**20:.1f} + "
        f"working tree {tree / 2**20:.1f}) of the device tool's {CARRY_LIMIT // 2**20} MiB"
    )
    if carried_bytes + tree > CARRY_LIMIT:
        raise SystemExit("over the device tool's limit: carry less")


def working_tree_bytes() -> int:
    """What the device tool sends besides the carried paths: tracked and untracked-not-ignored files."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout  # fmt: skip
    files = (ROOT / name for name in listing.decode().split("\0") if name)
    return sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())


def machine_environment(dest: Path) -> Path:
    """A virtual environment of the machine's packages at the lock's versions and nothing else (no system
    site-packages), built once under the cache, named by the hash of what it holds; returns its python."""
    requirements = (dest / "machine.txt").read_text().split()
    recipe = "\n".join([sys.version, *requirements])
    env = cache_root() / f"gpu-machine-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
    with locked(env):
        if not (env / READY).is_file():
            shutil.rmtree(env, ignore_errors=True)  # what an interrupted build left
            subprocess.run([sys.executable, "-m", "venv", env], check=True)
            pip = [env / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check"]
            subprocess.run([*pip, "--no-deps", *requirements], check=True)
            (env / READY).write_text(recipe)
    return env / "bin" / "python"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    wheels = commands.add_parser("wheels")
    wheels.add_argument("dest", type=Path)
    wheels.add_argument("--python-version", required=True, help="the target's X.Y, or local")
    machine = commands.add_parser("machine")
    machine.add_argument("dest", type=Path)
    args = parser.parse_args()
    if args.command == "wheels":
        build_wheels(args.dest.resolve(), args.python_version)
    else:
        print(machine_environment(args.dest.resolve()))


if __name__ == "__main__":
    main()
