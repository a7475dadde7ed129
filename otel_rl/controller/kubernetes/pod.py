"""The harness container's command of a coding rollout on Kubernetes: the local backend's sandbox, in a pod.

    python -m otel_rl.controller.kubernetes.pod --snapshot FILE --report FILE --limits JSON
        [--mode bubblewrap|unsandboxed] [--bind PATH]... -- HARNESS ARGV...

1. The task's snapshot (a gzipped tar the controller built from the task file and mounted from the attempt's
   Secret: the repository at its base commit, nothing of the grader's side) becomes a fresh one-commit git
   repository (no history to mine).
2. The harness runs over it in the sandbox of otel_rl/coding/sandbox.py, as under the local backend: bwrap
   with its own user, mount, PID, IPC and UTS namespaces, no view of the container's files but /usr, /etc
   and the Python environment, the rlimits and the wall clock. Its network namespace is the pod's, which
   the NetworkPolicy `otel-rl-harness` limits to the server's two ports and DNS (docs/kubernetes.md). It
   gets the container's environment (the contract, the rollout key, the template's own variables) without
   the runtime's (KUBERNETES_*, PATH, HOME), with the sandbox's mode and limits added to its resource.
3. Once bwrap has exited (its PID namespace, every process the agent started with it, is gone), the diff of
   the workspace against the snapshot is printed as the log's last lines, base64 of its gzip in lines of
   LINE_CHARS, and a small JSON report (exit status, whether the command started, whether the wall clock cut
   it, the diff's line count and sha256) is written to `--report`, the container's terminationMessagePath,
   which the controller reads from the pod's status. Neither is reachable from inside the sandbox.

The exit status is the harness's (124 when the wall clock cut it, 125 when the sandbox never started).
"""

import argparse
import base64
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from otel_rl.coding import sandbox
from otel_rl.coding.workspace import git
from otel_rl.controller.coding import inside_environment

LINE_CHARS = 8000  # under the 16 KiB at which container runtimes split a log line
MAX_DIFF_BYTES = 16 << 20  # gzipped; a larger diff is reported as such, never graded
TIMED_OUT, NOT_STARTED = 124, 125
# the container runtime's variables, not the harness's (bwrap sets its own PATH and HOME)
RUNTIME_VARS = ("PATH", "HOME", "HOSTNAME", "PWD", "SHLVL", "KUBERNETES_")


def unpack(snapshot: Path, dest: Path) -> str:
    """The snapshot as a one-commit repository in the empty folder dest; returns its commit."""
    # The data filter (no absolute paths, links out of the tree, devices) where the image's Python has it
    # (3.11.4 on); the archive is the controller's own either way.
    safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    with tarfile.open(snapshot, "r:gz") as tar:
        tar.extractall(dest, **safe)  # type: ignore[arg-type]
    git(dest, "init", "-q", "--template=", "--initial-branch=main")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "--no-verify", "--allow-empty", "-m", "snapshot")
    return git(dest, "rev-parse", "HEAD").decode().strip()


def diff(snapshot: Path, workspace: Path) -> bytes:
    """The workspace's changes against the snapshot. The agent's own `.git` is never read: its files are
    copied over a pristine repository made here (as workspace_diff does on the local backend)."""
    with tempfile.TemporaryDirectory(prefix="otel-rl-diff-") as scratch:
        pristine = Path(scratch)
        unpack(snapshot, pristine)
        for entry in pristine.iterdir():
            if entry.name != ".git":
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        shutil.copytree(workspace, pristine, symlinks=True, ignore=shutil.ignore_patterns(".git"),
                        dirs_exist_ok=True)  # fmt: skip
        git(pristine, "add", "-A")
        return git(pristine, "diff", "--cached", "--binary", "--no-renames", "--no-ext-diff", "HEAD")


def harness_environment(
    environ: dict[str, str], limits: sandbox.Limits, mode: sandbox.Mode
) -> dict[str, str]:
    """The container's variables the harness gets inside, with the sandbox's attributes on its resource."""
    kept = {key: value for key, value in environ.items() if not key.startswith(RUNTIME_VARS)}
    return inside_environment(kept, limits, mode)


def run(args: argparse.Namespace) -> int:
    limits = sandbox.Limits(**json.loads(args.limits))
    env = harness_environment(dict(os.environ), limits, args.mode)
    report: dict[str, object] = {"started": False, "timed_out": False, "exit_code": None}
    with tempfile.TemporaryDirectory(prefix="otel-rl-rollout-") as scratch:
        workspace = Path(scratch, "workspace")
        workspace.mkdir()
        unpack(args.snapshot, workspace)
        if args.mode == "unsandboxed":
            argv, gate = [*sandbox.limits_prefix(limits), *args.command], None
            popen_env, cwd = sandbox.plain_environment(env), workspace
        else:
            sandbox.hand_over(workspace)
            binds = tuple(sandbox.Bind(Path(path), path) for path in args.bind)
            wall = sandbox.bwrap_argv(workspace, args.command, limits=limits, binds=binds, env=env,
                                      shared_network=True)  # fmt: skip
            (argv, gate), popen_env, cwd = sandbox.gated(wall), {"PATH": os.environ.get("PATH", "")}, None
        try:
            fds = () if gate is None else (gate,)
            with subprocess.Popen(
                argv, env=popen_env, cwd=cwd, stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=fds
            ) as process:
                try:
                    report["exit_code"] = process.wait(timeout=limits.wall_seconds)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, 9)  # bwrap's session: --die-with-parent takes the sandbox along
                    process.wait()
                    report["timed_out"] = True
            report["started"] = gate is None or sandbox.command_started(gate)
        finally:
            if gate is not None:
                os.close(gate)
        if report["started"] and not report["timed_out"]:
            report |= print_diff(diff(args.snapshot, workspace))
    args.report.write_text(json.dumps(report))
    if not report["started"]:
        return NOT_STARTED
    if report["timed_out"]:
        return TIMED_OUT
    code = int(report["exit_code"] or 0)
    return code if code >= 0 else 128 - code  # killed by signal N: 128 + N, as a shell says it


def print_diff(patch: bytes) -> dict[str, object]:
    """Print the diff as base64 lines of its gzip; what the report says of it."""
    packed = base64.b64encode(gzip.compress(patch, mtime=0)).decode()
    if len(packed) > MAX_DIFF_BYTES:
        return {"diff_error": f"the diff is {len(patch)} bytes, over {MAX_DIFF_BYTES} gzipped"}
    lines = [packed[i : i + LINE_CHARS] for i in range(0, len(packed), LINE_CHARS)]
    sys.stdout.flush()
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    sys.stdout.flush()
    return {"diff_lines": len(lines), "diff_sha256": hashlib.sha256(patch).hexdigest()}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m otel_rl.controller.kubernetes.pod")
    parser.add_argument("--snapshot", type=Path, required=True)
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--limits", required=True)
    parser.add_argument("--mode", choices=["bubblewrap", "unsandboxed"], default="bubblewrap")
    parser.add_argument("--bind", action="append", default=[])
    parser.add_argument("command", nargs="+")
    sys.exit(run(parser.parse_args()))


if __name__ == "__main__":
    main()
