"""Bad input to the coding commands, on real parts (git, bubblewrap, pytest): a malformed task line, a gold
patch that fails, a repository that does not import, a sandbox that cannot start, a 100 MB patch. Each is an
error naming the task (or line) and the reason, and the command goes on with the other tasks."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from coding_tasks import BUGGY, calc_task_file

from otel_rl.coding.workspace import snapshot_commit

OTEL_RL = str(Path(sys.executable).with_name("otel-rl"))


def bad_task_file(root: Path) -> Path:
    """calc-1 (valid), a line that is no task, calc-gold-fails (its gold patch returns a float: the hidden
    tests check the type), calc-no-import (its repository imports a module that does not exist)."""
    path = calc_task_file(root)
    [line] = path.read_text().splitlines()
    good = json.loads(line)
    gold_fails = good | {
        "instance_id": "calc-gold-fails",
        "patch": good["patch"].replace("+    return a + b", "+    return a + b + 0.0"),
    }
    broken = root / "no-import-repo"
    shutil.copytree(root / "calc-repo", broken, ignore=shutil.ignore_patterns(".git"))
    module = broken / "calc" / "__init__.py"
    module.write_text(BUGGY + "\n\nimport no_such_module_of_otel_rl_tests\n")  # below the gold hunk
    no_import = good | {"instance_id": "calc-no-import", "repo_path": "no-import-repo"}
    no_import["base_commit"] = snapshot_commit(broken)
    malformed = json.dumps(good | {"instance_id": "calc-malformed", "patch": None})
    lines = [line, malformed, json.dumps(gold_fails), json.dumps(no_import)]
    path.write_text("".join(text + "\n" for text in lines))
    return path


def test_validate_names_each_bad_task_and_its_reason_and_goes_on(tmp_path: Path) -> None:
    tasks = bad_task_file(tmp_path)
    done = subprocess.run(
        [OTEL_RL, "tasks", "validate", str(tasks)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 1, done.stderr
    lines = {line["instance_id"]: line for line in map(json.loads, done.stdout.splitlines())}
    assert set(lines) == {None, "calc-1", "calc-gold-fails", "calc-no-import"}
    assert lines["calc-1"]["valid"] and lines["calc-1"]["reasons"] == []
    [malformed] = lines[None]["reasons"]
    assert "tasks.jsonl:2 (calc-malformed): patch: Input should be a valid string" in malformed
    [gold] = lines["calc-gold-fails"]["reasons"]
    assert gold.startswith("gold patch scores 0") and "tests/test_add.py::test_add failed" in gold
    # the hidden tests cannot even be collected: named as the repository's import error, the tests it
    # leaves missing after it
    [no_import] = lines["calc-no-import"]["reasons"]
    assert no_import.startswith(
        "gold patch scores 0: import_error: tests/test_add.py:"
        " ModuleNotFoundError: No module named 'no_such_module_of_otel_rl_tests'; "
    ), no_import
    assert "tests/test_add.py::test_add missing" in no_import


def test_grade_names_the_import_error_of_a_repository_that_does_not_import(tmp_path: Path) -> None:
    good, _malformed, _gold_fails, no_import = bad_task_file(tmp_path).read_text().splitlines()
    tasks = tmp_path / "no-import.jsonl"
    tasks.write_text(no_import + "\n")
    gold = tmp_path / "gold.diff"
    gold.write_text(json.loads(good)["patch"])
    done = subprocess.run(
        [OTEL_RL, "grade", str(tasks), "--instance", "calc-no-import", "--patch", str(gold)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    result = json.loads(done.stdout)
    assert result["reward"] == 0 and result["tests"]["tests/test_add.py::test_add"] == "missing", done.stdout
    # the visible tests import the same package: each test file that does not import is named
    assert result["collection_errors"] == [
        f"import_error: {file}: ModuleNotFoundError: No module named 'no_such_module_of_otel_rl_tests'"
        for file in ("tests/test_add.py", "tests/test_mul.py")
    ]


def test_a_sandbox_that_cannot_start_is_named_for_every_task_and_validate_goes_on(tmp_path: Path) -> None:
    tasks = calc_task_file(tmp_path)
    second = json.loads(tasks.read_text()) | {"instance_id": "calc-2"}
    tasks.write_text(tasks.read_text() + json.dumps(second) + "\n")
    path = tmp_path / "bin"  # git, and no bwrap
    path.mkdir()
    (path / "git").symlink_to(shutil.which("git"))
    done = subprocess.run(
        [OTEL_RL, "tasks", "validate", str(tasks)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PATH": str(path)},
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["instance_id"] for line in lines] == ["calc-1", "calc-2"]
    for line in lines:
        assert not line["valid"] and "sandbox: bwrap is not installed" in line["reasons"][0]


def test_a_100_mb_patch_is_refused_naming_the_task_before_it_is_read(tmp_path: Path) -> None:
    tasks = calc_task_file(tmp_path)
    patch = tmp_path / "huge.diff"
    with patch.open("wb") as file:
        file.truncate(100 << 20)  # sparse: 100 MB to stat, none to write
    done = subprocess.run(
        [OTEL_RL, "grade", str(tasks), "--instance", "calc-1", "--patch", str(patch)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and f"error: calc-1: {patch}: patch over 10 MiB" in done.stderr, done.stderr


def test_grade_goes_on_past_another_tasks_bad_line_and_names_it(tmp_path: Path) -> None:
    tasks = bad_task_file(tmp_path)  # line 2 is calc-malformed
    gold = tmp_path / "gold.diff"
    gold.write_text(json.loads(tasks.read_text().splitlines()[0])["patch"])
    grade = [OTEL_RL, "grade", str(tasks), "--patch", str(gold), "--instance"]
    done = subprocess.run([*grade, "calc-1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and json.loads(done.stdout)["reward"] == 1, done.stderr
    assert f"skipped: {tasks}:2 (calc-malformed): patch: Input should be a valid string" in done.stderr
    # asking for the malformed task itself: refused, the reason its line is bad named
    done = subprocess.run([*grade, "calc-malformed"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no task with instance_id 'calc-malformed'" in done.stderr, done.stderr
    assert f"error: {tasks}:2 (calc-malformed): patch: Input should be a valid string" in done.stderr


def test_a_limit_out_of_the_sandboxs_bounds_is_refused_naming_its_flag(tmp_path: Path) -> None:
    tasks = calc_task_file(tmp_path)
    for command, flag in (
        (["grade", str(tasks), "--instance", "calc-1", "--patch", os.devnull], "--cpu-seconds=0"),
        (["sandbox", "run", str(tasks), "--instance", "calc-1", "--", "true"], "--wall-seconds=0"),
    ):
        done = subprocess.run([OTEL_RL, *command[:-2], flag, *command[-2:]], capture_output=True, text=True)
        assert done.returncode == 2, done.stderr
        assert f"Invalid value for '{flag.split('=')[0]}'" in done.stderr
        assert "Traceback" not in done.stderr
