"""mini-smith: a real more-itertools sdist mutated, its tests run in the sandbox, graded by the real grader;
and the tasks table (otel-rl tasks load) fed from it."""

import json
import subprocess
from pathlib import Path

import pytest
from coding_tasks import MINISMITH_SEED as SEED
from coding_tasks import SDIST

from otel_rl.coding import sandbox
from otel_rl.coding.grader import grade
from otel_rl.coding.minismith import BuildError, build
from otel_rl.coding.mutate import apply, mutant, mutations
from otel_rl.coding.tasks import load_tasks
from otel_rl.query import query

LIMITS = sandbox.Limits(cpu_seconds=120, wall_seconds=180.0)


def test_each_mutator_edits_only_its_text() -> None:
    source = "def f(a, b):\n    x = a - b\n    if a < b:\n        x = 1\n    return x\n"
    found = {m.mutator: apply(source, m) for m in mutations(source)}
    assert found["swap_comparison"].count("a <= b") == 1
    assert "b - a" in found["swap_operands"]
    assert "if not (a < b):" in found["invert_condition"]
    assert "x = 2" in found["off_by_one"]
    assert all(mutant(source, m) is not None for m in mutations(source))
    assert set(found) == {
        "swap_comparison",
        "swap_operands",
        "invert_condition",
        "off_by_one",
        "drop_statement",
    }


def test_an_sdist_other_than_the_pinned_one_is_refused(tmp_path) -> None:
    other = tmp_path / SDIST.name
    data = SDIST.read_bytes()
    other.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # one bit off
    with pytest.raises(BuildError, match="not the pinned"):
        build(tmp_path / "ms.jsonl", seed=SEED, count=1, sdist=other)
    assert not (tmp_path / "ms.jsonl").exists()


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ms") / "ms.jsonl"
    build(out, seed=SEED, count=2, sdist=SDIST)
    return out


def test_build_is_reproducible_and_records_a_card(built, tmp_path) -> None:
    again = tmp_path / "ms.jsonl"
    build(again, seed=SEED, count=2, sdist=SDIST)
    assert again.read_bytes() == built.read_bytes()
    tasks = load_tasks(built).tasks
    assert len(tasks) == 2
    card = built.with_name("ms.card.md").read_text()
    assert "Tasks: 2" in card and "MIT" in card and "seed 275" in card
    for task in tasks:
        assert task.FAIL_TO_PASS and task.PASS_TO_PASS
        hidden = task.test_patch.split("\n", 1)[0]
        assert hidden.startswith("diff --git a/tests/test_")
        # the hidden test module is not in the agent's repository
        assert not (built.parent / task.repo_path / hidden.split()[-1].removeprefix("b/")).exists()


def test_fail_to_pass_fail_on_the_mutant_and_pass_with_the_gold_patch(built) -> None:
    task_set = load_tasks(built)
    for task in task_set.tasks:
        gold = grade(task_set, task, task.patch, limits=LIMITS)
        assert gold.reward == 1, gold
        empty = grade(task_set, task, "", limits=LIMITS)
        assert empty.reward == 0
        assert {test for test, status in empty.tests.items() if status != "passed"} == set(task.FAIL_TO_PASS)


def test_validate_accepts_a_built_task(built) -> None:
    done = subprocess.run(
        [str(Path(__file__).parents[1] / ".venv/bin/otel-rl"), "tasks", "validate", str(built)],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(lines) == 2 and all(line["valid"] for line in lines), done.stdout + done.stderr
    assert done.returncode == 0


def test_tasks_load_is_idempotent_and_keeps_the_hidden_fields_out(built, tmp_path) -> None:
    from typer.testing import CliRunner

    from otel_rl.cli import app

    db = tmp_path / "store.duckdb"
    for _ in range(2):
        result = CliRunner().invoke(app, ["tasks", "load", str(built), "--db", str(db)])
        assert result.exit_code == 0, result.output
    rows = query("SELECT * FROM tasks ORDER BY instance_id", db=db)
    tasks = sorted(load_tasks(built).tasks, key=lambda task: task.instance_id)
    assert rows["instance_id"].to_list() == [task.instance_id for task in tasks]
    assert rows["task_set"].to_list() == ["ms", "ms"]
    assert rows["fail_to_pass"].to_list() == [task.FAIL_TO_PASS for task in tasks]
    assert rows["sender"].to_list() == ["admin", "admin"]
    assert not {"test_patch", "patch"} & set(rows.columns)
