"""The sandbox a coding rollout (and the grader's test run) executes in: bubblewrap, no Docker, no root.

Own mount, PID, network, IPC and UTS namespaces (loopback only); a read-only view of /usr, /etc and the
Python environment alone (no host home, temp folders, task files or server state); the workspace bound
read-write at /workspace; rlimits on CPU time, address space, processes and file size; a wall clock.
Unprivileged callers get a user namespace too. A root caller runs the sandboxed command as nobody (setpriv,
every capability dropped): the kernel never enforces RLIMIT_NPROC on uid 0, even inside a user namespace.
"""

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from otel_rl.coding.forward import Denied, network

WORKSPACE = "/workspace"
HOME = "/home/agent"
UNPRIVILEGED = 65534  # nobody/nogroup: who the sandboxed command runs as when the caller is root
MAX_OUTPUT_BYTES = 8 << 20
# "unsandboxed": a plain process with the rlimits and the wall clock only, where the user asked for it by name
Mode = Literal["bubblewrap", "unsandboxed"]


class SandboxError(RuntimeError):
    """The sandbox cannot start here; the message says what is missing and how to enable it."""


class Limits(BaseModel):
    """Resource limits of one sandboxed command (rlimits inside the namespaces, and a wall clock)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpu_seconds: int = Field(600, ge=1)
    memory_bytes: int = Field(4 << 30, ge=1)
    processes: int = Field(256, ge=1)
    file_bytes: int = Field(1 << 30, ge=0)  # 0: the command writes no file
    wall_seconds: float = Field(1800.0, gt=0)


@dataclass(frozen=True)
class Completed:
    """What a sandboxed command did: its exit status (None when the wall clock cut it), its output."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    seconds: float
    denied: tuple[Denied, ...] = ()  # attempts to reach what the sandbox's network does not forward

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


@dataclass(frozen=True)
class Bind:
    """An extra host folder seen inside the sandbox at `inside`."""

    host: Path
    inside: str
    writable: bool = False


def sandbox_owner() -> tuple[int, int] | None:
    """The uid and gid the sandboxed command runs as when the caller is root, else None (the caller's)."""
    return (UNPRIVILEGED, UNPRIVILEGED) if os.geteuid() == 0 else None


def hand_over(path: Path) -> None:
    """Make a host folder writable by the sandboxed command (it runs as nobody when the caller is root)."""
    os.chmod(path, 0o755)  # bwrap enters it before the command drops to nobody
    owner = sandbox_owner()
    if owner is None:
        return
    os.lchown(path, *owner)
    for root, directories, files in os.walk(path):
        for name in directories + files:
            os.lchown(os.path.join(root, name), *owner)


def _namespaces(shared_network: bool = False) -> list[str]:
    """bwrap's namespaces; `shared_network`: the network namespace is the one bwrap was started in
    (forward.network made it, and bwrap's command gets no privilege over it)."""
    others = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if sandbox_owner() is None:
        if not shared_network:
            return ["--unshare-all"]  # user, mount, PID, network, IPC, UTS, cgroup
        # started as root of forward.network's user namespace: map back to the caller's own ids
        return ["--unshare-user", "--uid", str(os.getuid()), "--gid", str(os.getgid()), *others]
    # root: no user namespace (it would map uid 0 only), so that setpriv can become nobody inside
    return others if shared_network else ["--unshare-net", *others]


def _identity() -> list[str]:
    owner = sandbox_owner()
    if owner is None:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise SandboxError("setpriv (Debian package util-linux) is not installed")
    return [setpriv, f"--reuid={owner[0]}", f"--regid={owner[1]}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--"]  # fmt: skip


def _system_mounts() -> list[str]:
    """Read-only /usr and /etc, with the merged-/usr links as links."""
    argv = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(name):
            argv += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            argv += ["--ro-bind", name, name]
    return argv


def _hidden_host_folders() -> list[str]:
    """Fresh, empty tmpfs over the host's home and temp folders, then the agent's own home."""
    folders = ["/tmp", "/var/tmp", "/home", "/root", "/run", os.path.expanduser("~")]
    argv: list[str] = []
    for folder in dict.fromkeys(folders):
        if folder != "/":
            argv += ["--perms", "0755" if folder != "/tmp" else "1777", "--tmpfs", folder]
    return [*argv, "--perms", "0777", "--dir", HOME]  # the agent's own, writable whoever it runs as


def _python_mounts() -> list[str]:
    """The interpreter tests run with, read-only, even where it lives under the host's (hidden) home; its
    parent folders are made traversable (bwrap would create them 0700)."""
    prefixes = dict.fromkeys(os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix))
    argv: list[str] = []
    for prefix in prefixes:
        if prefix.startswith("/usr/"):
            continue
        argv += [*_traversable_parents(prefix), "--ro-bind", prefix, prefix]
    return argv


def _traversable_parents(inside: str) -> list[str]:
    """The folders above a mount point, made traversable by whoever the command runs as."""
    argv: list[str] = []
    for parent in reversed(Path(inside).parents):
        if str(parent) != "/":
            argv += ["--perms", "0755", "--dir", str(parent)]
    return argv


def bwrap_argv(
    workspace: Path,
    command: list[str],
    *,
    limits: Limits,
    binds: tuple[Bind, ...] = (),
    env: dict[str, str] | None = None,
    shared_network: bool = False,
) -> list[str]:
    """The full command line: bwrap's namespaces and mounts, then the identity switch (root callers), then
    `prlimit` (inside the namespaces: RLIMIT_NPROC counts this sandbox's processes), then the command.
    `shared_network`: run under forward.network's prefix, in the network namespace it made."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxError("bwrap (Debian package bubblewrap) is not installed")
    argv = [
        bwrap,
        *_namespaces(shared_network),
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
    ]
    argv += _system_mounts() + _hidden_host_folders() + _python_mounts()
    argv += ["--proc", "/proc", "--dev", "/dev", "--bind", str(workspace), WORKSPACE]
    for bind in binds:
        argv += _traversable_parents(bind.inside)
        argv += ["--bind" if bind.writable else "--ro-bind", str(bind.host), bind.inside]
    argv += ["--remount-ro", "/", "--chdir", WORKSPACE, "--clearenv"]
    path = f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin"
    base = {"PATH": path, "HOME": HOME, "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
    for name, value in (base | (env or {})).items():
        argv += ["--setenv", name, value]
    return [*argv, "--", *_identity(), *limits_prefix(limits), *command]


def gated(argv: list[str]) -> tuple[list[str], int]:
    """bwrap's argv with a gate: bwrap's child reads one byte from --block-fd after its setup, right before
    exec, so a byte still there afterwards means the command never started. The command cannot put it back
    (it holds no write end). The caller passes the fd to bwrap and closes it after `command_started`."""
    gate, writer = os.pipe()
    os.write(writer, b"x")
    os.close(writer)
    return [argv[0], "--block-fd", str(gate), *argv[1:]], gate


def command_started(gate: int) -> bool:
    """Whether the sandboxed command was executed (bwrap read the gate's byte); call after bwrap exited."""
    os.set_blocking(gate, False)
    try:
        return os.read(gate, 1) != b"x"
    except BlockingIOError:
        return True


def run(
    workspace: Path,
    command: list[str],
    *,
    limits: Limits,
    binds: tuple[Bind, ...] = (),
    env: dict[str, str] | None = None,
    capture: bool = True,
    forward: tuple[int, ...] = (),
    record_denied: bool = False,
) -> Completed:
    """Run `command` in a fresh sandbox over `workspace`; the wall clock kills the whole session. A sandbox
    whose setup failed (its command never ran) raises SandboxError, apart from the command's own failures.
    `forward`: host loopback ports (the gateway's, the OTLP endpoint's) reachable inside on the same ports;
    what else the command tried to reach is in `denied` (forward.py), recorded whenever a port is forwarded
    or `record_denied` asks for it (bwrap's own empty network otherwise: nothing observed)."""
    probe_user_namespaces()
    if not forward and not record_denied:
        argv, gate = gated(bwrap_argv(workspace, command, limits=limits, binds=binds, env=env))
        return _run(argv, gate, limits=limits, capture=capture)
    try:
        with network(list(forward), python=sys.executable) as net:
            wall = bwrap_argv(workspace, command, limits=limits, binds=binds, env=env, shared_network=True)
            argv, gate = gated(wall)
            done = _run([*net.prefix, *argv], gate, limits=limits, capture=capture)
            net.settle()
            return replace(done, denied=tuple(net.denied))
    except OSError as error:  # no unshare or ip here, or a namespace the kernel refused
        raise SandboxError(f"the sandbox's network cannot be set up: {error}") from None


def _run(argv: list[str], gate: int, *, limits: Limits, capture: bool) -> Completed:
    pipe = subprocess.PIPE if capture else None
    started = time.perf_counter()
    try:
        with subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe, start_new_session=True, pass_fds=(gate,)
        ) as process:
            try:
                stdout, stderr = process.communicate(timeout=limits.wall_seconds)
                returncode: int | None = process.returncode
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)  # bwrap's own session: --die-with-parent takes the sandbox with it
                stdout, stderr = process.communicate()
                returncode = None
        seconds = time.perf_counter() - started
        never_started = not command_started(gate)
    finally:
        os.close(gate)
    if never_started:
        reason = (stderr or b"").decode(errors="replace").strip()[-500:]
        raise SandboxError(f"the sandbox did not start: {reason or 'bwrap exited before its command'}")
    return Completed(
        returncode, (stdout or b"")[-MAX_OUTPUT_BYTES:], (stderr or b"")[-MAX_OUTPUT_BYTES:], seconds
    )


def limits_prefix(limits: Limits) -> list[str]:
    """`prlimit` setting the rlimits, then the command: what an unsandboxed command keeps of the sandbox."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        raise SandboxError("prlimit (Debian package util-linux) is not installed")
    return [prlimit, f"--cpu={limits.cpu_seconds}", f"--as={limits.memory_bytes}",
            f"--nproc={limits.processes}", f"--fsize={limits.file_bytes}", "--"]  # fmt: skip


def plain_environment(env: dict[str, str] | None) -> dict[str, str]:
    """The environment a sandboxed command gets, for an unsandboxed one (nothing inherited)."""
    path = f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin"
    return {"PATH": path, "HOME": os.path.expanduser("~"), "LANG": "C.UTF-8"} | (env or {})


def run_unsandboxed(
    workspace: Path, command: list[str], *, limits: Limits, env: dict[str, str] | None = None
) -> Completed:
    """Run `command` in `workspace` as a plain process: rlimits and the wall clock, no namespaces."""
    started = time.perf_counter()
    with subprocess.Popen(
        [*limits_prefix(limits), *command], cwd=workspace, env=plain_environment(env),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    ) as process:  # fmt: skip
        try:
            stdout, stderr = process.communicate(timeout=limits.wall_seconds)
            returncode: int | None = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            stdout, stderr = process.communicate()
            returncode = None
    seconds = time.perf_counter() - started
    return Completed(returncode, stdout[-MAX_OUTPUT_BYTES:], stderr[-MAX_OUTPUT_BYTES:], seconds)


@cache
def probe_user_namespaces() -> None:
    """Start one empty sandbox; if the kernel refuses its namespaces, say what is missing and how to enable
    them."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxError("bwrap is not installed: apt-get install bubblewrap (or make debian-tools)")
    probe = subprocess.run(
        [bwrap, *_namespaces(), *_system_mounts(), "--", "true"], capture_output=True, timeout=30
    )
    if probe.returncode != 0:
        reason = probe.stderr.decode(errors="replace").strip()[:500]
        raise SandboxError(
            f"bubblewrap cannot create its namespaces here ({reason}). Enable unprivileged user namespaces: "
            "`sysctl -w kernel.unprivileged_userns_clone=1` (Debian/Ubuntu kernels), "
            "`sysctl -w user.max_user_namespaces=15000` (when it is 0), and on Ubuntu 24.04+ "
            "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`; in a container, a seccomp/AppArmor "
            "profile that allows unshare(CLONE_NEWUSER)."
        )
