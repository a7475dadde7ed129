"""The grader outside the sandbox: real git, real pytest in a real bubblewrap sandbox, junit ids."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from coding_tasks import FIXED, HIDDEN_TEST, calc_task_file

from otel_rl.coding import sandbox
from otel_rl.coding.grader import MAX_PATCH_BYTES, PatchError, grade
from otel_rl.coding.tasks import Task, TaskSet, load_tasks
from otel_rl.coding.validate import CANARIES, canary_patch, validate
from otel_rl.coding.workspace import git, make_workspace, workspace_diff

OTEL_RL = str(Path(sys.executable).with_name("otel-rl"))
LIMITS = sandbox.Limits(cpu_seconds=30, wall_seconds=60)
F2P = ["tests/test_add.py::test_add", "tests/test_add.py::test_add_zero"]
P2P = "tests/test_mul.py::TestMul::test_mul"


@pytest.fixture
def calc(tmp_path: Path) -> tuple[TaskSet, Task]:
    task_set = load_tasks(calc_task_file(tmp_path))
    return task_set, task_set.tasks[0]


def edited(task_set: TaskSet, task: Task, scratch: Path, files: dict[str, str]) -> str:
    """The diff an agent leaves after writing `files` into its workspace."""
    tree = make_workspace(task_set, task, scratch)
    for path, content in files.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(content)
    return workspace_diff(task_set, task, tree)


def weak_reward(task_set: TaskSet, task: Task, patch: str, scratch: Path) -> int:
    """The scorer this grader replaces: the whole patch applied in the agent's tree, the hidden tests added
    where the agent left no file of theirs, pytest's exit code read."""
    tree = make_workspace(task_set, task, scratch)
    if patch:
        git(tree, "apply", stdin=patch.encode())
    if not (tree / "tests" / "test_add.py").exists():
        (tree / "tests" / "test_add.py").write_text(HIDDEN_TEST)
    sandbox.hand_over(tree)
    done = sandbox.run(tree, ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider"], limits=LIMITS,
                       env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})  # fmt: skip
    return int(done.returncode == 0)


def test_the_gold_patch_scores_1_and_the_empty_patch_0(calc: tuple[TaskSet, Task]) -> None:
    task_set, task = calc
    gold = grade(task_set, task, task.patch, limits=LIMITS)
    assert (gold.outcome, gold.reward, gold.dropped_paths) == ("graded", 1, [])
    assert gold.tests == {F2P[0]: "passed", F2P[1]: "passed", P2P: "passed"}
    empty = grade(task_set, task, "", limits=LIMITS)
    assert empty.reward == 0 and empty.tests == {F2P[0]: "failed", F2P[1]: "passed", P2P: "passed"}


def test_test_and_config_hunks_are_dropped_and_named_the_rest_applied(
    calc: tuple[TaskSet, Task], tmp_path: Path
) -> None:
    task_set, task = calc
    files = {
        "calc/__init__.py": FIXED,
        "tests/test_mul.py": "def test_mul():\n    assert False\n",
        "conftest.py": "",
        "lib/helper_test.py": "",
        "setup.cfg": "[tool:pytest]\naddopts = -x\n",
        "evil.pth": "import os\n",
        "pyproject.toml": "[tool.pytest.ini_options]\naddopts = '--co'\n",
        "docs/notes.md": "kept\n",
    }
    result = grade(task_set, task, edited(task_set, task, tmp_path / "w", files), limits=LIMITS)
    assert result.reward == 1
    assert sorted(result.dropped_paths) == sorted(
        [
            "tests/test_mul.py",
            "conftest.py",
            "lib/helper_test.py",
            "setup.cfg",
            "evil.pth",
            "pyproject.toml [tool.pytest]",
        ]
    )


def test_a_pyproject_change_outside_the_pytest_section_is_kept(
    calc: tuple[TaskSet, Task], tmp_path: Path
) -> None:
    task_set, task = calc
    files = {"calc/__init__.py": FIXED, "pyproject.toml": "[project]\nname = 'calc'\n"}
    result = grade(task_set, task, edited(task_set, task, tmp_path / "w", files), limits=LIMITS)
    assert (result.reward, result.dropped_paths) == (1, [])


def test_every_canary_scores_0_here_and_several_score_1_under_the_exit_code_scorer(
    calc: tuple[TaskSet, Task], tmp_path: Path
) -> None:
    task_set, task = calc
    weak: dict[str, int] = {}
    for name in CANARIES:
        patch = canary_patch(task_set, task, name)
        assert grade(task_set, task, patch, limits=LIMITS).reward == 0, name
        weak[name] = weak_reward(task_set, task, patch, tmp_path / name)
    # The guards are what hold: an exit-code scorer in the agent's tree pays these hacks.
    assert {name for name, reward in weak.items() if reward} >= {
        "hidden_tests_overwritten", "conftest_rewrites_reports", "exit_at_import"
    }  # fmt: skip
    assert weak_reward(task_set, task, task.patch, tmp_path / "gold") == 1
    assert validate(task_set, task, limits=LIMITS).model_dump() == {
        "instance_id": "calc-1",
        "valid": True,
        "reasons": [],
    }


def test_a_forged_junit_file_written_before_exit_counts_as_no_results(
    calc: tuple[TaskSet, Task], tmp_path: Path
) -> None:
    task_set, task = calc
    cases = "".join(
        f'<testcase file="tests/test_add.py" classname="tests.test_add" name="{name}"/>'
        for name in ("test_add", "test_add_zero")
    )
    cases += '<testcase file="tests/test_mul.py" classname="tests.test_mul.TestMul" name="test_mul"/>'
    forge = (
        "import os\n"
        f"xml = '<testsuites><testsuite name=\"pytest\">{cases}</testsuite></testsuites>'\n"
        "open('/grader/junit.xml', 'w').write(xml)\n"
        "os._exit(0)\n"
    )
    result = grade(
        task_set, task, edited(task_set, task, tmp_path / "w", {"calc/__init__.py": forge}), limits=LIMITS
    )
    assert result.reward == 0 and set(result.tests.values()) == {"missing"}


def test_a_hanging_test_run_is_an_infrastructure_failure_not_a_reward(
    calc: tuple[TaskSet, Task], tmp_path: Path
) -> None:
    task_set, task = calc
    hang = "import time\ntime.sleep(120)\n" + FIXED
    patch = edited(task_set, task, tmp_path / "w", {"calc/__init__.py": hang})
    result = grade(task_set, task, patch, limits=sandbox.Limits(wall_seconds=3))
    assert (result.outcome, result.reward) == ("infrastructure_error", None)
    assert "wall clock" in (result.error or "")


def test_a_hanging_test_is_a_failed_test_named_and_the_others_still_run(
    calc: tuple[TaskSet, Task], tmp_path: Path
) -> None:
    task_set, task = calc
    # add(0, 0) hangs: test_add_zero would hold the run up to its wall clock; the per-test timeout fails it
    hang = FIXED.replace("def add(a, b):\n", "def add(a, b):\n    while a == 0:\n        time.sleep(1)\n")
    patch = edited(task_set, task, tmp_path / "w", {"calc/__init__.py": "import time\n" + hang})
    result = grade(task_set, task, patch, limits=LIMITS, test_timeout_s=2)
    assert (result.outcome, result.reward) == ("graded", 0)
    assert result.tests == {F2P[0]: "passed", F2P[1]: "failed", P2P: "passed"}
    assert result.seconds < 30  # far below the 60 s wall clock: the run did not wait for it


def test_a_patch_that_does_not_apply_is_an_infrastructure_failure(calc: tuple[TaskSet, Task]) -> None:
    task_set, task = calc
    stale = task.patch.replace("-    return a - b", "-    return a ** b")
    result = grade(task_set, task, stale, limits=LIMITS)
    assert (result.outcome, result.reward) == ("infrastructure_error", None)
    assert result.error.startswith("the patch does not apply")


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (
            "diff --git a/../x b/../x\nnew file mode 100644\n--- /dev/null\n+++ b/../x\n@@ -0,0 +1 @@\n+x\n",
            "outside the repository",
        ),
        (
            "diff --git a/.git/config b/.git/config\nnew file mode 100644\n--- /dev/null\n"
            "+++ b/.git/config\n@@ -0,0 +1 @@\n+x\n",
            "outside",
        ),
        ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n", "not a git diff"),
        ("diff --git a/x b/x\n" + "+" * (MAX_PATCH_BYTES + 1), "over 10 MiB"),
    ],
)
def test_bad_patches_are_clear_errors(calc: tuple[TaskSet, Task], patch: str, message: str) -> None:
    task_set, task = calc
    with pytest.raises(PatchError, match=message):
        grade(task_set, task, patch, limits=LIMITS)


def test_grade_command_prints_reward_tests_and_dropped_paths(
    calc: tuple[TaskSet, Task], tmp_path: Path
) -> None:
    task_set, task = calc
    diff = tmp_path / "agent.diff"
    diff.write_text(edited(task_set, task, tmp_path / "w", {"calc/__init__.py": FIXED, "conftest.py": ""}))
    done = subprocess.run(
        [OTEL_RL, "grade", str(task_set.path), "--instance", "calc-1", "--patch", str(diff)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["reward"], result["dropped_paths"], result["tests"][P2P]) == (1, ["conftest.py"], "passed")
    diff.write_text("not a diff\n")
    bad = subprocess.run(
        [OTEL_RL, "grade", str(task_set.path), "--instance", "calc-1", "--patch", str(diff)],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "calc-1: not a git diff" in bad.stderr
