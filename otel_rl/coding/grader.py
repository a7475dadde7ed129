"""The grader, outside the agent's sandbox: the agent's diff, less test hunks, on a pristine copy with the
hidden tests, pytest in a new sandbox, and a 0/1 reward read from per-test results (never an exit code)."""

import secrets
import shutil
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ElementTree
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel

from otel_rl.coding import sandbox
from otel_rl.coding.tasks import Task, TaskError, TaskSet
from otel_rl.coding.workspace import git, make_workspace

MAX_PATCH_BYTES = 10 << 20
MAX_JUNIT_BYTES = 64 << 20
# A test running longer is stopped and failed (pytest-timeout, SIGALRM: the run goes on with the next test);
# the sandbox's wall clock stays the bound of the whole run.
TEST_TIMEOUT_S = 60.0
# Files that steer how tests are collected, run or reported: an agent's hunk on one of them is dropped.
TEST_CONFIG_NAMES = {"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg"}
STARTUP_HOOKS = {"sitecustomize.py", "usercustomize.py"}
# Plugins installed beside pytest in the grader's environment are not the task's: none loads on its own.
PYTEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
TestStatus = Literal["passed", "failed", "missing", "error"]


class PatchError(ValueError):
    """A patch the grader refuses to look at (too big, not a git diff, a path outside the repository)."""


class GradeResult(BaseModel):
    """One graded patch. `reward` is None when the grading itself failed (outcome `infrastructure_error`):
    such a failure is counted apart from the model's and never becomes a reward."""

    instance_id: str
    outcome: Literal["graded", "infrastructure_error"]
    reward: int | None
    tests: dict[str, TestStatus]
    dropped_paths: list[str]
    error: str | None = None
    seconds: float
    # why test files could not be collected, one per file: `import_error: FILE: EXCEPTION` when importing it
    # raised (a repository that does not import), else `collection_error: FILE: EXCEPTION`
    collection_errors: list[str] = []


def is_test_path(path: str) -> bool:
    """Whether a repository path is a test file or test configuration the agent must not change."""
    parts = PurePosixPath(path).parts
    name = parts[-1]
    return (
        "tests" in parts[:-1]
        or fnmatch(name, "test_*.py")
        or fnmatch(name, "*_test.py")
        or fnmatch(name, "*.pth")
        or name in TEST_CONFIG_NAMES
        or name in STARTUP_HOOKS
    )


def _check_path(path: str) -> None:
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or ".git" in pure.parts or not pure.parts:
        raise PatchError(f"path {path!r} is outside the repository")


def split_patch(patch: str, scratch: Path) -> list[tuple[list[str], str]]:
    """The patch's file sections, each with every path it touches (both sides of a rename), as git reads
    them (`git apply --numstat -z`): quoting and binary sections are git's business, not a regex's."""
    if len(patch.encode(errors="surrogateescape")) > MAX_PATCH_BYTES:
        raise PatchError(f"patch over {MAX_PATCH_BYTES >> 20} MiB")
    if not patch.strip():
        return []
    lines = patch.splitlines(keepends=True)
    if not lines[0].startswith("diff --git "):
        raise PatchError("not a git diff: the first line does not start with 'diff --git '")
    sections: list[str] = []
    for line in lines:
        if line.startswith("diff --git "):
            sections.append("")
        sections[-1] += line
    try:
        numstat = git(scratch, "apply", "--numstat", "-z", stdin=patch.encode(errors="surrogateescape"))
    except TaskError as error:
        raise PatchError(f"not a patch git can read: {error}") from None
    fields = numstat.decode(errors="surrogateescape").split("\0")
    paths: list[list[str]] = []
    index = 0
    while index < len(fields) - 1:
        counts_and_path = fields[index].split("\t", 2)
        if counts_and_path[2]:
            paths.append([counts_and_path[2]])
            index += 1
        else:  # a rename or copy: the old and the new path follow
            paths.append([fields[index + 1], fields[index + 2]])
            index += 3
    if len(paths) != len(sections):
        raise PatchError(f"git reads {len(paths)} file sections where the patch has {len(sections)} headers")
    for touched in paths:
        for path in touched:
            _check_path(path)
    return list(zip(paths, sections, strict=True))


def _pytest_section(text: str) -> object:
    try:
        return tomllib.loads(text).get("tool", {}).get("pytest")
    except tomllib.TOMLDecodeError:
        return "unparseable"  # differs from any parsed section: an unreadable pyproject is dropped


def _base_text(tree: Path, path: str) -> str:
    if not git(tree, "ls-tree", "--name-only", "HEAD", "--", path).strip():
        return ""
    return git(tree, "show", f"HEAD:{path}").decode(errors="replace")


def _restore(tree: Path, path: str) -> None:
    """Put one path back as it is at the base commit (or remove it where the base has none)."""
    target = tree / path
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()
    if git(tree, "ls-tree", "--name-only", "HEAD", "--", path).strip():
        git(tree, "checkout", "-q", "HEAD", "--", path)


def apply_agent_patch(tree: Path, patch: str) -> list[str]:
    """Apply the agent's patch to a pristine tree, less its test and test-configuration sections (and a
    pyproject.toml change to [tool.pytest]); return the dropped paths."""
    dropped: list[str] = []
    kept = ""
    kept_paths: list[str] = []
    for paths, section in split_patch(patch, tree):
        if any(is_test_path(path) for path in paths):
            dropped += paths
        else:
            kept += section
            kept_paths += paths
    if kept:
        git(tree, "apply", "--whitespace=nowarn", stdin=kept.encode(errors="surrogateescape"))
    for path in dict.fromkeys(kept_paths):
        if PurePosixPath(path).name == "pyproject.toml":
            base = _base_text(tree, path)
            after = (tree / path).read_text(errors="replace") if (tree / path).is_file() else ""
            if _pytest_section(base) != _pytest_section(after):
                _restore(tree, path)
                dropped.append(f"{path} [tool.pytest]")
    return list(dict.fromkeys(dropped))


def add_hidden_tests(tree: Path, test_patch: str) -> None:
    """The hidden tests over whatever the agent left at their paths: each is restored to the base first."""
    for paths, _section in split_patch(test_patch, tree):
        for path in paths:
            _restore(tree, path)
    if test_patch.strip():
        git(tree, "apply", "--whitespace=nowarn", stdin=test_patch.encode(errors="surrogateescape"))


def test_id(case: ElementTree.Element) -> str:
    """A junit testcase (xunit1: `file`, `classname`, `name`) as pytest's node id."""
    file = case.get("file", "")
    classname = case.get("classname", "")
    module = file.removesuffix(".py").replace("/", ".")
    inner = classname[len(module) + 1 :] if classname.startswith(module + ".") else ""
    return "::".join(part for part in (file, *inner.split("."), case.get("name", "")) if part)


def _suite(xml: bytes, nonce: str) -> ElementTree.Element | None:
    root = ElementTree.fromstring(xml)
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    return suites[0] if [suite.get("name") for suite in suites] == [nonce] else None


def read_junit(xml: bytes, *, nonce: str) -> dict[str, TestStatus]:
    """Per-test statuses from pytest's junit XML; a file whose suite does not carry this run's nonce (one
    the code under test wrote before killing pytest, say) counts as no results."""
    suite = _suite(xml, nonce)
    if suite is None:
        return {}
    rank = {"passed": 0, "failed": 1, "error": 2}
    statuses: dict[str, TestStatus] = {}
    for case in suite.iter("testcase"):
        status: TestStatus = "passed"
        if case.find("error") is not None:
            status = "error"
        elif case.find("failure") is not None or case.find("skipped") is not None:
            status = "failed"  # a skipped test did not pass
        identifier = test_id(case)
        if rank[status] >= rank[statuses.get(identifier, "passed")]:
            statuses[identifier] = status
    return statuses


def read_collection_errors(xml: bytes, *, nonce: str) -> list[str]:
    """The test files pytest could not collect, each with its exception (the traceback's last `E` line):
    `import_error: FILE: EXCEPTION` where importing the file raised, which is how a repository that does
    not import shows (its tests are then missing, not failed)."""
    suite = _suite(xml, nonce)
    reasons: list[str] = []
    for case in suite.iter("testcase") if suite is not None else ():
        error = case.find("error")
        if error is None or error.get("message") != "collection failure":
            continue
        text = error.text or ""
        raised = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
        kind = "import_error" if "in <module>" in text or "while importing" in text else "collection_error"
        file = case.get("file") or case.get("name", "")
        reasons.append(f"{kind}: {file}: {raised[-1] if raised else text.strip()[-300:]}")
    return reasons


def pytest_command(
    test_files: list[str],
    *,
    nonce: str,
    root: str = sandbox.WORKSPACE,
    out: str = "/grader",
    test_timeout_s: float = TEST_TIMEOUT_S,
) -> list[str]:
    """Isolated pytest (`-I`: no user site, no PYTHON* variables, no script folder on sys.path), no cache,
    junit XML written outside the tree being tested (`root`, `out`: where the sandbox shows them), each test
    failed once it runs past `test_timeout_s` (pytest-timeout, loaded by name: PYTEST_ENV loads no plugin
    on its own)."""
    return [
        "python", "-I", "-B", "-m", "pytest", "-p", "no:cacheprovider", "-q",
        "-p", "timeout", f"--timeout={test_timeout_s:g}", "--timeout-method=signal",
        f"--rootdir={root}", "-o", f"pythonpath={root}",
        f"--junitxml={out}/junit.xml", "-o", "junit_family=xunit1", "-o", f"junit_suite_name={nonce}",
        "--", *test_files,
    ]  # fmt: skip


def grade(
    task_set: TaskSet,
    task: Task,
    patch: str,
    *,
    limits: sandbox.Limits,
    mode: sandbox.Mode = "bubblewrap",
    test_timeout_s: float = TEST_TIMEOUT_S,
) -> GradeResult:
    """Grade one patch. Bad input (PatchError) is raised; a failure of the grading machinery is returned
    as outcome `infrastructure_error` with no reward. A test past `test_timeout_s` is a failed test; the
    run past the wall clock of `limits` an infrastructure failure. `mode` "unsandboxed" (asked for by name
    only) runs pytest as a plain process with the same rlimits and wall clock."""
    started = time.perf_counter()
    expected = task.expected_tests
    files = list(dict.fromkeys(test.split("::")[0] for test in expected))
    with tempfile.TemporaryDirectory(prefix="otel-rl-grade-") as scratch:
        tree, out = Path(scratch, "tree"), Path(scratch, "out")
        tree.mkdir()
        out.mkdir()
        make_workspace(task_set, task, tree)
        try:
            dropped = apply_agent_patch(tree, patch)
        except TaskError as error:
            return _failed(task, f"the patch does not apply: {error}", [], started)
        try:
            add_hidden_tests(tree, task.test_patch)
        except (TaskError, PatchError) as error:
            return _failed(task, f"the hidden tests do not apply: {error}", dropped, started)
        sandbox.hand_over(Path(scratch))
        nonce = secrets.token_hex(16)
        binds = (sandbox.Bind(out, "/grader", writable=True),)
        try:
            if mode == "unsandboxed":
                command = pytest_command(
                    files, nonce=nonce, root=str(tree), out=str(out), test_timeout_s=test_timeout_s
                )
                done = sandbox.run_unsandboxed(tree, command, limits=limits, env=PYTEST_ENV)
            else:
                command = pytest_command(files, nonce=nonce, test_timeout_s=test_timeout_s)
                done = sandbox.run(tree, command, limits=limits, binds=binds, env=PYTEST_ENV)
        except sandbox.SandboxError as error:
            return _failed(task, f"sandbox: {error}", dropped, started)
        if done.timed_out:
            return _failed(task, f"tests ran past the {limits.wall_seconds:g} s wall clock", dropped, started)
        junit = out / "junit.xml"
        statuses: dict[str, TestStatus] = {}
        collection_errors: list[str] = []
        if junit.is_file() and not junit.is_symlink() and junit.stat().st_size <= MAX_JUNIT_BYTES:
            try:
                statuses = read_junit(junit.read_bytes(), nonce=nonce)
                collection_errors = read_collection_errors(junit.read_bytes(), nonce=nonce)
            except ElementTree.ParseError:
                statuses = {}  # torn or forged XML: no results, so every expected test is missing
    tests: dict[str, TestStatus] = {test: statuses.get(test, "missing") for test in expected}
    reward = int(bool(expected) and all(status == "passed" for status in tests.values()))
    return GradeResult(
        instance_id=task.instance_id, outcome="graded", reward=reward, tests=tests, dropped_paths=dropped,
        seconds=time.perf_counter() - started, collection_errors=collection_errors,
    )  # fmt: skip


def _failed(task: Task, error: str, dropped: list[str], started: float) -> GradeResult:
    return GradeResult(
        instance_id=task.instance_id, outcome="infrastructure_error", reward=None,
        tests={test: "missing" for test in task.expected_tests}, dropped_paths=dropped, error=error,
        seconds=time.perf_counter() - started,
    )  # fmt: skip
