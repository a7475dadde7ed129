"""The sandbox a coding rollout (and the grader's test run) executes in: bubblewrap, no Docker, no root.

Own mount, PID, network, IPC, UTS and user namespaces (`--unshare-all`: loopback only); a read-only view of
the system folders and of the Python environment alone (no host home, temp folders, task files or server
state); the workspace bound read-write at /workspace; rlimits on CPU time, address space, processes and file
size; a wall clock. Run as root, the sandbox drops to an unprivileged user first: the kernel never enforces
RLIMIT_NPROC on uid 0, even inside a user namespace.
"""

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

WORKSPACE = "/workspace"
HOME = "/home/agent"
UNPRIVILEGED = 65534  # nobody/nogroup: the sandbox's uid and gid when the caller is root
MAX_OUTPUT_BYTES = 8 << 20


class SandboxError(RuntimeError):
    """The sandbox cannot start here; the message says what is missing and how to enable it."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed command (rlimits inside the namespaces, and a wall clock)."""

    cpu_seconds: int = 600
    memory_bytes: int = 4 << 30
    processes: int = 256
    file_bytes: int = 1 << 30
    wall_seconds: float = 1800.0


@dataclass(frozen=True)
class Completed:
    """What a sandboxed command did: its exit status (None when the wall clock cut it), its output."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    seconds: float

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
    """The uid and gid the sandbox runs as when it must drop privileges (the caller is root), else None."""
    return (UNPRIVILEGED, UNPRIVILEGED) if os.geteuid() == 0 else None


def hand_over(path: Path) -> None:
    """Make a host folder the sandbox's own (writable inside) when the sandbox drops to another user."""
    owner = sandbox_owner()
    if owner is None:
        return
    os.lchown(path, *owner)
    for root, directories, files in os.walk(path):
        for name in directories + files:
            os.lchown(os.path.join(root, name), *owner)


def _drop_privileges() -> None:  # runs in the child between fork and exec
    owner = sandbox_owner()
    if owner is not None:
        os.setgroups([])
        os.setgid(owner[1])
        os.setuid(owner[0])


def _system_mounts() -> list[str]:
    """Read-only system folders: /usr and /etc, the merged-/usr links as links, and the Python environment
    (the interpreter the sandbox runs tests with), even where it lives under the host's home."""
    argv = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(name):
            argv += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            argv += ["--ro-bind", name, name]
    return argv


def _hidden_host_folders() -> list[str]:
    """Fresh, empty tmpfs over the host's home and temp folders, then the agent's own home."""
    argv = [
        "--tmpfs",
        "/tmp",
        "--tmpfs",
        "/var/tmp",
        "--tmpfs",
        "/home",
        "--tmpfs",
        "/root",
        "--tmpfs",
        "/run",
    ]
    host_home = os.path.expanduser("~")
    if host_home not in ("/", "/root") and not host_home.startswith("/home/"):
        argv += ["--tmpfs", host_home]
    return [*argv, "--dir", HOME]


def _python_mounts() -> list[str]:
    prefixes = dict.fromkeys(os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix))
    argv: list[str] = []
    for prefix in prefixes:
        if not prefix.startswith("/usr/"):
            argv += ["--ro-bind", prefix, prefix]
    return argv


def bwrap_argv(
    workspace: Path, command: list[str], *, limits: Limits, binds: tuple[Bind, ...] = ()
) -> list[str]:
    """The full command line: bwrap's namespaces and mounts, then `prlimit` (inside the new user namespace,
    so RLIMIT_NPROC counts this sandbox's processes only), then the command."""
    bwrap = shutil.which("bwrap")
    prlimit = shutil.which("prlimit")
    if bwrap is None or prlimit is None:
        missing = (
            "bwrap (Debian package bubblewrap)" if bwrap is None else "prlimit (Debian package util-linux)"
        )
        raise SandboxError(f"{missing} is not installed")
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    argv += _system_mounts() + _hidden_host_folders() + _python_mounts()
    argv += ["--proc", "/proc", "--dev", "/dev", "--bind", str(workspace), WORKSPACE]
    for bind in binds:
        argv += ["--bind" if bind.writable else "--ro-bind", str(bind.host), bind.inside]
    argv += ["--remount-ro", "/", "--chdir", WORKSPACE, "--clearenv"]
    path = f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin"
    for name, value in (("PATH", path), ("HOME", HOME), ("TMPDIR", "/tmp"), ("LANG", "C.UTF-8")):
        argv += ["--setenv", name, value]
    argv += ["--", prlimit, f"--cpu={limits.cpu_seconds}", f"--as={limits.memory_bytes}"]
    argv += [f"--nproc={limits.processes}", f"--fsize={limits.file_bytes}", "--", *command]
    return argv


def run(
    workspace: Path,
    command: list[str],
    *,
    limits: Limits,
    binds: tuple[Bind, ...] = (),
    capture: bool = True,
) -> Completed:
    """Run `command` in a fresh sandbox over `workspace`; the wall clock kills the whole session."""
    probe_user_namespaces()
    argv = bwrap_argv(workspace, command, limits=limits, binds=binds)
    pipe = subprocess.PIPE if capture else None
    started = time.perf_counter()
    with subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=pipe,
        stderr=pipe,
        preexec_fn=_drop_privileges,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=limits.wall_seconds)
            returncode: int | None = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)  # bwrap's own session: --die-with-parent takes the sandbox down with it
            stdout, stderr = process.communicate()
            returncode = None
    return Completed(
        returncode,
        (stdout or b"")[-MAX_OUTPUT_BYTES:],
        (stderr or b"")[-MAX_OUTPUT_BYTES:],
        time.perf_counter() - started,
    )


@cache
def probe_user_namespaces() -> None:
    """Start one empty sandbox; if user namespaces are refused, say what is missing and how to enable it."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxError("bwrap is not installed: apt-get install bubblewrap (or make debian-tools)")
    probe = subprocess.run(
        [bwrap, "--unshare-all", *_system_mounts(), "--", "true"],
        capture_output=True,
        preexec_fn=_drop_privileges,
        timeout=30,
    )
    if probe.returncode != 0:
        reason = probe.stderr.decode(errors="replace").strip()[:500]
        raise SandboxError(
            f"bubblewrap cannot create user namespaces here ({reason}). Enable them: "
            "`sysctl -w kernel.unprivileged_userns_clone=1` (Debian/Ubuntu kernels), "
            "`sysctl -w user.max_user_namespaces=15000` (when it is 0), and on Ubuntu 24.04+ "
            "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`; in a container, a seccomp/AppArmor "
            "profile that allows unshare(CLONE_NEWUSER)."
        )
