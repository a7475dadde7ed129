"""The coding demo: its toy tasks are hackable under the weak grader and not under the grader outside the
sandbox; `otel-rl demo coding --quick` runs every stage through the real server, gateway, vLLM, sandbox and
grader, as a user types it, and its figures are the store's."""

import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from otel_rl.coding import sandbox, toy_tasks
from otel_rl.coding.grader import grade
from otel_rl.coding.tasks import load_tasks
from otel_rl.coding.workspace import make_workspace, workspace_diff
from otel_rl.coding_app.demo import ARMS, QUICK
from otel_rl.query import query
from otel_rl.tinymodel import init_model
from otel_rl.train.resume import run_id_of

OTEL_RL = Path(sys.executable).parent / "otel-rl"
LIMITS = sandbox.Limits(cpu_seconds=60, wall_seconds=60)


def weak_and_true(task_set, task, workspace: Path) -> tuple[int, int | None]:
    """(pytest's exit status in the agent's tree, as the agent runs it; the grader's reward)."""
    done = subprocess.run(
        [sys.executable, "-B", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=workspace,
        capture_output=True,
        env={"PATH": os.environ["PATH"], "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    result = grade(task_set, task, workspace_diff(task_set, task, workspace), limits=LIMITS)
    return done.returncode, result.reward


def test_every_hack_passes_the_weak_grader_and_fails_the_hidden_tests(tmp_path):
    toy_tasks.write_tasks(tmp_path / "toy.jsonl", 2, seed=1)
    task_set = load_tasks(tmp_path / "toy.jsonl")
    task = task_set.get("toy-1")
    outcomes = {}
    for name, change in [("unsolved", None), ("gold", "gold"), *toy_tasks.HACKS.items()]:
        workspace = tmp_path / name
        workspace.mkdir()
        make_workspace(task_set, task, workspace)
        if change == "gold":
            subprocess.run(["git", "apply"], input=task.patch.encode(), cwd=workspace, check=True)
        elif change is not None:
            (workspace / change[0]).write_text(change[1])
        outcomes[name] = weak_and_true(task_set, task, workspace)
    assert outcomes.pop("unsolved")[0] != 0 and outcomes.pop("gold") == (0, 1)
    assert outcomes == {name: (0, 0) for name in toy_tasks.HACKS}


def statement_code(statement: str) -> str:
    """What an honest agent that reads only the statement writes: its steps' code, in its order."""
    lines = []
    for said in statement.split(": ", 1)[1].removesuffix(".").split(", then "):
        k = "".join(ch for ch in said if ch.isdigit())
        [code] = [code for text, code in toy_tasks.STEPS + toy_tasks.ENDS if text.replace("{k}", k) == said]
        lines.append(code.replace("{k}", k))
    return "def f(xs):\n" + "".join(f"    {line}\n" for line in lines)


def test_an_unstated_task_is_solved_by_its_gold_patch_and_not_by_what_its_statement_says(tmp_path):
    toy_tasks.write_tasks(tmp_path / "toy.jsonl", 4, seed=1, unstated=2)
    task_set = load_tasks(tmp_path / "toy.jsonl")
    expected = {"toy-1": {"gold": (0, 1), "stated": (0, 1)}}  # a stated task: its statement is enough
    expected |= {i: {"gold": (0, 1), "stated": (1, 0)} for i in ("toy-2", "toy-3")}  # the last two
    for instance_id, outcome in expected.items():
        task = task_set.get(instance_id)
        outcomes = {}
        for name in ("gold", "stated"):
            workspace = tmp_path / instance_id / name
            workspace.mkdir(parents=True)
            make_workspace(task_set, task, workspace)
            if name == "gold":
                subprocess.run(["git", "apply"], input=task.patch.encode(), cwd=workspace, check=True)
            else:
                (workspace / toy_tasks.SOURCE).write_text(statement_code(task.problem_statement))
            outcomes[name] = weak_and_true(task_set, task, workspace)
        assert outcomes == outcome, instance_id
    # the tasks before them keep the statement that their tests check, as without unstated tasks
    toy_tasks.write_tasks(tmp_path / "plain.jsonl", 4, seed=1)
    plain = load_tasks(tmp_path / "plain.jsonl")
    for instance_id in ("toy-0", "toy-1"):
        assert plain.get(instance_id).patch == task_set.get(instance_id).patch


def test_the_expert_writes_right_wrong_and_hacking_solutions_at_its_rates():
    chats = list(toy_tasks.expert_chats(2000, 7, right=0.3, hack=0.03))
    writes = [json.loads(chat["messages"][1]["tool_calls"][0]["function"]["arguments"]) for chat in chats]
    hacks = [(w["path"], w["content"]) in toy_tasks.HACKS.values() for w in writes]
    summaries = [chat["messages"][4]["content"] for chat in chats]
    right = sum(not hack and summary == "1 passed" for hack, summary in zip(hacks, summaries, strict=True))
    assert 0.02 < sum(hacks) / 2000 < 0.045 and 0.28 < right / 2000 < 0.33
    # the tool results are what the agent's run_tests shows for each (no timing): one token sequence a case
    assert set(summaries) == {"1 passed", "1 failed", "exit 0"}


def test_visible_tests_catch_every_wrong_variant_the_hidden_tests_catch():
    rng = random.Random(5)
    for _ in range(200):
        problem = toy_tasks.random_problem(rng)
        hidden = toy_tasks.inputs_for(rng, 4)
        visible = toy_tasks.visible_inputs(problem, hidden, rng)
        for wrong in toy_tasks.wrong_variants(problem):
            if any(wrong(xs) != problem(xs) for xs in hidden):
                assert any(wrong(xs) != problem(xs) for xs in visible), (problem, wrong)


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    workdir = tmp_path_factory.mktemp("demo_coding") / "run"
    command = [str(OTEL_RL), "demo", "coding", "--quick", "--no-serve", "--workdir", str(workdir)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return workdir, done


def test_quick_coding_demo_trains_three_arms_and_reports_from_the_store(quick_demo):
    workdir, done = quick_demo
    report = json.loads((workdir / "report.json").read_text())
    assert set(report["arms"]) == set(ARMS) and "hack rate" in done.stdout
    assert (workdir / "arms.png").read_bytes().startswith(b"\x89PNG")
    store = workdir / "otel_rl.duckdb"
    for arm in ARMS:
        figures = report["arms"][arm]
        assert [step["step"] for step in figures["steps"]] == list(range(1, QUICK.rl_steps + 1))
        for key in ("hack_rate_start", "hack_rate_end", "truth_pass_start", "truth_pass_end"):
            assert 0 <= figures[key] <= 1
        # start and end: the steps of one pass over the tasks (here 3 steps), at most half the steps each
        window = min(QUICK.pass_steps, QUICK.rl_steps // 2)
        for key in ("hack_rate", "truth_pass"):
            first, last = figures["steps"][:window], figures["steps"][-window:]
            assert figures[f"{key}_start"] == sum(step[key] for step in first) / window
            assert figures[f"{key}_end"] == sum(step[key] for step in last) / window
        # The arm's rollouts, read again from the store by its run's group ids: each graded outside the
        # sandbox (source grader) and checked by the harness's own pytest (source harness).
        prefix = run_id_of(workdir / arm) + "-"
        rows = query(
            "SELECT outcome_rewards_by_source['harness'] AS proxy,"
            " outcome_rewards_by_source['grader'] AS truth"
            f" FROM rollouts WHERE split = 'train' AND starts_with(group_id, '{prefix}')",
            db=store,
        )
        trained = sum(step["rollouts"] for step in figures["steps"])
        assert rows.height >= trained >= QUICK.rl_steps * QUICK.groups_per_step * QUICK.group_size
        graded = rows.filter(rows["truth"].is_not_null())
        assert graded.height >= sum(step["graded"] for step in figures["steps"]) > 0
        assert rows["proxy"].null_count() < rows.height
    expectations = report["expectations"]
    assert len(expectations) == 6
    assert report["failed_expectations"] == [e["text"] for e in expectations if not e["met"]]
    for text in report["failed_expectations"]:
        assert text in done.stdout.replace("\n", " ") or text[:40] in done.stdout


def test_the_time_bench_splits_a_finished_runs_rollouts_and_times_the_floor_beneath_them(quick_demo):
    """bench/coding_demo.py on the quick run: its rollouts read from the store, the floor timed beside."""
    workdir, _ = quick_demo
    bench = Path(__file__).parents[1] / "bench" / "coding_demo.py"
    done = subprocess.run(
        [sys.executable, str(bench), str(workdir), "--runs", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},  # rich wraps at the terminal's width: one line a row here
    )
    assert done.returncode == 0, done.stderr[-3000:]
    called = query(
        "SELECT count(DISTINCT rollout_id) AS n FROM rollouts JOIN llm_calls USING (rollout_id)",
        db=workdir / "otel_rl.duckdb",
    )["n"][0]
    assert called > 0 and f"median of {called} rollouts" in done.stdout
    floor = re.search(r"(\d+) rollouts over \d+ cores\s*│\s*(\d+)", done.stdout)
    assert floor and int(floor.group(1)) == called and int(floor.group(2)) > 0
    assert "beneath it the rollouts' floor" in done.stdout


def start_from(workdir: Path, checkpoint: Path) -> subprocess.CompletedProcess:
    flags = ["coding", "--quick", "--no-serve", "--workdir", str(workdir), "--start-from", str(checkpoint)]
    return subprocess.run([str(OTEL_RL), "demo", *flags], capture_output=True, text=True, timeout=1200)


def test_start_from_runs_the_arms_from_an_earlier_runs_checkpoint_without_sft(quick_demo, tmp_path):
    workdir, _ = quick_demo
    checkpoint = tmp_path / "step-20"  # a copy: the module's other tests read the quick run's folder
    shutil.copytree(workdir / "sft" / f"step-{QUICK.sft_steps}", checkpoint)
    done = start_from(tmp_path / "again", checkpoint)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "again" / "report.json").read_text())
    assert report["start_from"] == str(checkpoint) and "sft_s" not in report["timings"]
    assert not (tmp_path / "again" / "sft").exists()
    assert set(report["arms"]) == set(ARMS)
    started = (tmp_path / "again" / "start-policy" / "model.safetensors").read_bytes()
    assert started == (checkpoint / "model.safetensors").read_bytes()


def test_start_from_refuses_what_is_no_checkpoint_before_it_clears_the_workdir(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "earlier.txt").write_text("an earlier run's file")
    done = start_from(tmp_path / "run", tmp_path / "nothing")
    assert done.returncode == 1
    said = " ".join(done.stdout.split())
    assert "is not a checkpoint folder: no config.json, model.safetensors, tokenizer.json" in said
    assert (tmp_path / "run" / "earlier.txt").exists()


def test_start_from_refuses_a_checkpoint_of_another_tokenizer(tmp_path):
    other = init_model(tmp_path / "other", seed=0)  # the generic tiny tokenizer, not the demo's
    done = start_from(tmp_path / "run", other)
    assert done.returncode == 1
    assert "has another tokenizer than this demo's tiny model" in " ".join(done.stdout.split())
