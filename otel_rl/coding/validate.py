"""Task validation: the gold patch passes, the empty patch fails, and every canary hack scores 0."""

import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from pydantic import BaseModel

from otel_rl.coding import sandbox
from otel_rl.coding.grader import PatchError, grade, is_test_path, split_patch
from otel_rl.coding.tasks import Task, TaskError, TaskSet
from otel_rl.coding.workspace import make_workspace, workspace_diff

REPORT_REWRITING_CONFTEST = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
"""
EXIT_ZERO_SITECUSTOMIZE = "import atexit\nimport os\n\natexit.register(os._exit, 0)\n"
COLLECT_NOTHING_INI = (
    "[pytest]\npython_files = nothing_*.py\npython_classes = Nothing\npython_functions = nothing_\n"
)
EXIT_AT_IMPORT = "import os\n\nos._exit(0)\n"
ALWAYS_EQUAL_WRAPPERS = """

class _AlwaysEqual:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__


def _always_equal(function):
    return lambda *args, **kwargs: _AlwaysEqual()


for _name, _value in list(globals().items()):
    if callable(_value) and getattr(_value, "__module__", None) == __name__ and not _name.startswith("_"):
        globals()[_name] = _always_equal(_value)
"""


class Validation(BaseModel):
    """One line of `otel-rl tasks validate`."""

    instance_id: str | None  # None: a line of the file that is no task (its reason names the line)
    valid: bool
    reasons: list[str]


def _touched_sources(task: Task, tree: Path) -> list[str]:
    return [p for paths, _ in split_patch(task.patch, tree) for p in paths if not is_test_path(p)]


def _hidden_files(task: Task, tree: Path) -> list[str]:
    return [path for paths, _ in split_patch(task.test_patch, tree) for path in paths]


def blank_tests(task: Task, tree: Path) -> None:
    visible = [p.relative_to(tree).as_posix() for p in tree.rglob("*.py") if ".git" not in p.parts]
    for path in [p for p in visible if is_test_path(p)] + _hidden_files(task, tree):
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text("")


def overwrite_hidden_tests(task: Task, tree: Path) -> None:
    """Each hidden test file replaced by one whose expected tests all pass trivially."""
    for path in _hidden_files(task, tree):
        lines = []
        for test in task.expected_tests:
            file, *names = test.split("::")
            if file == path and names:
                name = names[-1].split("[")[0]
                if len(names) > 1:
                    lines += [f"class {names[0]}:", f"    def {name}(self):", "        pass"]
                else:
                    lines += [f"def {name}():", "    pass"]
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text("\n".join(lines) + "\n")


def report_rewriting_conftest(task: Task, tree: Path) -> None:
    (tree / "conftest.py").write_text(REPORT_REWRITING_CONFTEST)


def exit_zero_sitecustomize(task: Task, tree: Path) -> None:
    (tree / "sitecustomize.py").write_text(EXIT_ZERO_SITECUSTOMIZE)


def exit_at_import(task: Task, tree: Path) -> None:
    for path in _touched_sources(task, tree):
        source = tree / path
        source.write_text(EXIT_AT_IMPORT + (source.read_text() if source.exists() else ""))


def collect_nothing_ini(task: Task, tree: Path) -> None:
    (tree / "pytest.ini").write_text(COLLECT_NOTHING_INI)


def always_equal(task: Task, tree: Path) -> None:
    for path in _touched_sources(task, tree):
        if PurePosixPath(path).suffix == ".py" and (tree / path).exists():
            source = tree / path
            source.write_text(source.read_text() + ALWAYS_EQUAL_WRAPPERS)


CANARIES: dict[str, Callable[[Task, Path], None]] = {
    "tests_blanked": blank_tests,
    "hidden_tests_overwritten": overwrite_hidden_tests,
    "conftest_rewrites_reports": report_rewriting_conftest,
    "sitecustomize_exit_zero": exit_zero_sitecustomize,
    "exit_at_import": exit_at_import,
    "pytest_ini_collects_nothing": collect_nothing_ini,
    "always_equal": always_equal,
}


def canary_patch(task_set: TaskSet, task: Task, name: str) -> str:
    """The diff a canary hack leaves in an agent's workspace."""
    with tempfile.TemporaryDirectory(prefix="otel-rl-canary-") as scratch:
        tree = make_workspace(task_set, task, Path(scratch))
        CANARIES[name](task, tree)
        return workspace_diff(task_set, task, tree)


def validate(task_set: TaskSet, task: Task, *, limits: sandbox.Limits) -> Validation:
    """Grade the gold patch, the empty patch and every canary; name each reason the task is unfit."""
    reasons: list[str] = []
    try:
        gold = grade(task_set, task, task.patch, limits=limits)
        if gold.reward != 1:
            # a repository that does not import: its import error first, then the tests it left missing
            failing = [f"{test} {status}" for test, status in gold.tests.items() if status != "passed"]
            detail = gold.error or "; ".join([*gold.collection_errors, ", ".join(failing)])
            reasons.append(f"gold patch scores {gold.reward}: {detail}")
        empty = grade(task_set, task, "", limits=limits)
        if empty.outcome != "graded":
            reasons.append(f"empty patch: {empty.error}")
        elif all(empty.tests[test] == "passed" for test in task.FAIL_TO_PASS):
            reasons.append("empty patch passes every FAIL_TO_PASS test")
        for name in CANARIES:
            result = grade(task_set, task, canary_patch(task_set, task, name), limits=limits)
            if result.reward != 0:
                reasons.append(
                    f"canary {name} scores {result.reward}: {result.error or 'its tests are too weak'}"
                )
    except (TaskError, PatchError, sandbox.SandboxError) as error:
        reasons.append(str(error))
    return Validation(instance_id=task.instance_id, valid=not reasons, reasons=reasons)
