"""The task format: SWE-bench instances as published, plus repo_path; malformed lines name line and reason."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from coding_tasks import calc_task_file

from otel_rl.coding.tasks import TaskError, load_tasks

OTEL_RL = str(Path(sys.executable).with_name("otel-rl"))


def test_a_published_instance_loads_with_lists_as_json_strings_or_lists(tmp_path: Path) -> None:
    task_set = load_tasks(calc_task_file(tmp_path))
    task = task_set.get("calc-1")
    assert task.FAIL_TO_PASS == ["tests/test_add.py::test_add", "tests/test_add.py::test_add_zero"]
    assert task.PASS_TO_PASS == ["tests/test_mul.py::TestMul::test_mul"]
    assert task_set.repo_dir(task) == (tmp_path / "calc-repo").resolve()


def _line(tmp_path: Path, **changes: object) -> dict:
    path = tmp_path / "tasks.jsonl"
    record = json.loads((path if path.exists() else calc_task_file(tmp_path)).read_text())
    return record | changes


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"FAIL_TO_PASS": "[not json"}, r":2 \(calc-1\): FAIL_TO_PASS: .*not a list nor a JSON string"),
        ({"FAIL_TO_PASS": 7}, r":2 \(calc-1\): FAIL_TO_PASS: .*valid list"),
        ({"instance_id": "../escape"}, r":2 \(\.\./escape\): instance_id: String should match pattern"),
        ({"patch": None}, r":2 \(calc-1\): patch: Input should be a valid string"),
        ({"PASS_TO_PASS": ["a\nb"]}, r":2 \(calc-1\): PASS_TO_PASS: .*multi-line"),
    ],
)
def test_a_malformed_line_names_the_line_the_instance_and_the_reason(
    tmp_path: Path, change: dict, message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    good = _line(tmp_path) | {"instance_id": "other"}
    path.write_text(json.dumps(good) + "\n" + json.dumps(_line(tmp_path, **change)) + "\n")
    with pytest.raises(TaskError, match=message):
        load_tasks(path)


def test_missing_fields_duplicates_and_non_json_are_clear_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    record = _line(tmp_path)
    path.write_text(json.dumps({k: v for k, v in record.items() if k != "test_patch"}) + "\n")
    with pytest.raises(TaskError, match=r"bad.jsonl:1 \(calc-1\): test_patch: Field required"):
        load_tasks(path)
    path.write_text(json.dumps(record) + "\n\n" + json.dumps(record) + "\n")
    with pytest.raises(TaskError, match=r"bad.jsonl:3 \(calc-1\): instance_id appears twice"):
        load_tasks(path)
    path.write_text("{oops\n")
    with pytest.raises(TaskError, match=r"bad.jsonl:1: not JSON"):
        load_tasks(path)
    path.write_text("[1]\n")
    with pytest.raises(TaskError, match=r"bad.jsonl:1: a task is a JSON object, got list"):
        load_tasks(path)
    with pytest.raises(TaskError, match="no such task file"):
        load_tasks(tmp_path / "absent.jsonl")


def test_tasks_list_prints_one_line_a_task_without_hidden_tests(tmp_path: Path) -> None:
    path = calc_task_file(tmp_path)
    done = subprocess.run([OTEL_RL, "tasks", "list", str(path)], capture_output=True, text=True, check=True)
    assert [json.loads(line) for line in done.stdout.splitlines()] == [
        {
            "instance_id": "calc-1",
            "repo": "example/calc",
            "base_commit": load_tasks(path).tasks[0].base_commit,
            "fail_to_pass": 2,
            "pass_to_pass": 1,
        }
    ]
    path.write_text("{oops\n")
    bad = subprocess.run([OTEL_RL, "tasks", "list", str(path)], capture_output=True, text=True)
    assert bad.returncode == 2 and "tasks.jsonl:1: not JSON" in bad.stderr
