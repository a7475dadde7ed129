"""Task files for the coding tests: a small git repository with history, HumanEval problems, and a mini-smith
task."""

import json
import subprocess
from pathlib import Path

from otel_rl.coding import humaneval, minismith

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
FIXED = "def add(a, b):\n    return a + b  # FUTURE-FIX-MARKER\n\n\ndef mul(a, b):\n    return a * b\n"
VISIBLE_TEST = (
    "from calc import mul\n\n\nclass TestMul:\n    def test_mul(self):\n        assert mul(2, 3) == 6\n"
)
# type() as well as ==: an object whose __eq__ is always True must not pass.
HIDDEN_TEST = (
    "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5 and type(add(2, 3)) is int\n\n\n"
    "def test_add_zero():\n    assert add(0, 0) == 0 and type(add(0, 0)) is int\n"
)
HIDDEN_MARKER = "test_add_zero"
# The pinned more-itertools sdist, in the repository (tests/data/README.md): the builds fetch nothing.
SDIST = Path(__file__).parent / "data" / "more_itertools-10.8.0.tar.gz"
# This seed's first draw is in recipes.py, whose tests run in about 3 s (more.py's take 10-20 s).
MINISMITH_SEED = 275


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _staged_diff(repo: Path, path: str, content: str) -> str:
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(content)
    _git(repo, "add", "-A")
    diff = _git(repo, "diff", "--cached", "HEAD")
    _git(repo, "reset", "-q", "--hard", "HEAD")
    _git(repo, "clean", "-q", "-fd")
    return diff


def calc_task_file(root: Path) -> Path:
    """`root/tasks.jsonl` with one task, `calc-1`, on a git repository whose later commit holds the fix
    (history an agent must not see)."""
    repo = root / "calc-repo"
    (repo / "calc").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calc" / "__init__.py").write_text(BUGGY)
    (repo / "tests" / "test_mul.py").write_text(VISIBLE_TEST)
    _git(repo, "init", "-q", "--initial-branch=main")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    patch = _staged_diff(repo, "calc/__init__.py", FIXED)
    test_patch = _staged_diff(repo, "tests/test_add.py", HIDDEN_TEST)
    (repo / "calc" / "__init__.py").write_text(FIXED)
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-am", "the fix, from the future")
    task = {
        "instance_id": "calc-1",
        "repo": "example/calc",
        "base_commit": base,
        "problem_statement": "add() subtracts.",
        "FAIL_TO_PASS": json.dumps(["tests/test_add.py::test_add", "tests/test_add.py::test_add_zero"]),
        "PASS_TO_PASS": ["tests/test_mul.py::TestMul::test_mul"],
        "test_patch": test_patch,
        "patch": patch,
        "repo_path": "calc-repo",
        "version": "1.0",  # published instances carry more fields
    }
    path = root / "tasks.jsonl"
    path.write_text(json.dumps(task) + "\n")
    return path


def humaneval_task_file(root: Path, *, count: int, guard: bool = True) -> Path:
    """The first `count` HumanEval problems as tasks (`guard=False`: the package's check() alone)."""
    out = root / "humaneval.jsonl"
    if guard:
        humaneval.build(out, limit=count)
        return out
    lines = []
    for problem in humaneval.read_problems()[:count]:
        name = problem["task_id"].replace("/", "_")
        record = humaneval.build_task(
            problem, root / "humaneval" / name, repo_path=f"humaneval/{name}", guard=False
        )
        lines.append(json.dumps(record))
    out.write_text("\n".join(lines) + "\n")
    return out


def minismith_task_file(root: Path) -> Path:
    """`root/ms.jsonl`: one mini-smith task (a bug injected into more-itertools' recipes.py), built from the
    pinned sdist (about 13 s on a loaded 2-core machine)."""
    out = root / "ms.jsonl"
    minismith.build(out, seed=MINISMITH_SEED, count=1, sdist=SDIST)
    return out
