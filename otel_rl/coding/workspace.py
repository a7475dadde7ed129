"""A task's workspace: a fresh one-commit repository of its snapshot (no history to mine), and its diff."""

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from otel_rl.coding.tasks import Task, TaskError, TaskSet

MAX_WORKSPACE_BYTES = 2 << 30
# The snapshot commit is the same bytes on every machine: a plain-folder task's base_commit is its hash.
_IDENTITY = {
    "GIT_AUTHOR_NAME": "otel-rl",
    "GIT_AUTHOR_EMAIL": "tasks@otel-rl.invalid",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "otel-rl",
    "GIT_COMMITTER_EMAIL": "tasks@otel-rl.invalid",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}


def git(directory: Path, *args: str, stdin: bytes | None = None) -> bytes:
    """Run git on a repository this process made, ignoring the user's and the system's configuration (a
    hook, filter or fsmonitor there must not run on task content)."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
        **_IDENTITY,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
    }
    done = subprocess.run(
        ["git", "-c", "core.hooksPath=/dev/null", "-C", str(directory), *args],
        input=stdin,
        capture_output=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise TaskError(f"git {args[0]} in {directory}: {done.stderr.decode(errors='replace').strip()[:500]}")
    return done.stdout


def _is_git_repository(directory: Path) -> bool:
    return (directory / ".git").exists()


def _ignore_git(_folder: str, names: list[str]) -> set[str]:
    return {name for name in names if name == ".git"}


def _snapshot(task_set: TaskSet, task: Task, dest: Path) -> None:
    source = task_set.repo_dir(task)
    if _is_git_repository(source):
        archive = git(source, "archive", "--format=tar", f"{task.base_commit}^{{commit}}")
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest, filter="data")  # no absolute paths, links out of the tree, devices
    else:
        shutil.copytree(source, dest, symlinks=True, ignore=_ignore_git, dirs_exist_ok=True)


def _commit_all(directory: Path) -> str:
    git(directory, "init", "-q", "--template=", "--initial-branch=main")  # no sample hooks
    git(directory, "add", "-A")
    git(directory, "commit", "-q", "--no-verify", "--allow-empty", "-m", "snapshot")
    return git(directory, "rev-parse", "HEAD").decode().strip()


def make_workspace(task_set: TaskSet, task: Task, dest: Path) -> Path:
    """Fill the empty folder `dest` with the task's snapshot as a one-commit repository; a plain-folder
    task's content must hash to its base_commit (a changed folder is refused, not graded silently)."""
    _snapshot(task_set, task, dest)
    head = _commit_all(dest)
    if not _is_git_repository(task_set.repo_dir(task)) and head != task.base_commit:
        raise TaskError(
            f"{task.instance_id}: the folder {task.repo_path!r} hashes to {head}, not base_commit "
            f"{task.base_commit}: it changed since the task was made"
        )
    return dest


def snapshot_commit(directory: Path) -> str:
    """The base_commit a plain folder gets as a task's repository (its one-commit snapshot's hash)."""
    with tempfile.TemporaryDirectory(prefix="otel-rl-snapshot-") as scratch:
        shutil.copytree(directory, scratch, symlinks=True, ignore=_ignore_git, dirs_exist_ok=True)
        return _commit_all(Path(scratch))


def _tree_bytes(directory: Path) -> int:
    total = 0
    for root, directories, files in os.walk(directory):
        directories[:] = [name for name in directories if name != ".git"]
        total += sum(os.lstat(os.path.join(root, name)).st_size for name in files)
        if total > MAX_WORKSPACE_BYTES:
            raise TaskError(f"{directory}: workspace over {MAX_WORKSPACE_BYTES >> 30} GiB")
    return total


def workspace_diff(task_set: TaskSet, task: Task, workspace: Path) -> str:
    """The workspace's changes against the task's base, as a binary-safe git diff. The agent's own `.git`
    (config, hooks, index) is never read: its files are copied over a pristine snapshot this process made."""
    _tree_bytes(workspace)
    with tempfile.TemporaryDirectory(prefix="otel-rl-diff-") as scratch:
        pristine = make_workspace(task_set, task, Path(scratch))
        for entry in pristine.iterdir():
            if entry.name != ".git":
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        shutil.copytree(workspace, pristine, symlinks=True, ignore=_ignore_git, dirs_exist_ok=True)
        git(pristine, "add", "-A")
        return git(pristine, "diff", "--cached", "--binary", "--no-renames", "--no-ext-diff", "HEAD").decode(
            errors="surrogateescape"
        )
