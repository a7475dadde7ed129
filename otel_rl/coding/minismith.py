"""The mini-smith task set: bugs injected by AST mutation into more-itertools, whose source distribution ships
its tests; FAIL_TO_PASS and PASS_TO_PASS found by running them in the sandbox, before and after."""

import ast
import hashlib
import json
import random
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ElementTree
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from otel_rl.coding import sandbox
from otel_rl.coding.grader import PYTEST_ENV, TestStatus, pytest_command, read_junit
from otel_rl.coding.mutate import Mutation, apply, mutant, mutations
from otel_rl.coding.workspace import git, snapshot_commit

PACKAGE = "more-itertools"
VERSION = "10.8.0"
# The sdist pip fetches is checked against this: another file is refused, so a build is the same bytes.
SDIST_SHA256 = "f638ddf8a1a0d134181275fb5d58b086ead7c6a72429ad725c67503f13ba30bd"
ROOT = f"more_itertools-{VERSION}"
UPSTREAM = "more-itertools/more-itertools"
# Each mutated module and the test module that covers it: that test module is the task's hidden test.
MODULES = {
    "more_itertools/recipes.py": "tests/test_recipes.py",
    "more_itertools/more.py": "tests/test_more.py",
}
KEPT = ("more_itertools/", "tests/", "LICENSE", "README.rst")
# One test took 27 s here, more than the rest of its module together: it is left out of the task's tests
# (every task's grading would pay for it). Class and method.
SLOW_TESTS = {"tests/test_recipes.py": [("PrimeFunctionTests", "test_primes")]}
DEFAULT_COUNT = 4
MAX_COUNT = 200
TRIES_PER_TASK = 6  # a mutant no test notices is tried again elsewhere, this many times per task at most
LIMITS = sandbox.Limits(cpu_seconds=120, wall_seconds=180.0)
FOLDER_NAME = re.compile(r"more-itertools__[A-Za-z0-9_]+__[a-z_]+__L\d+")


class BuildError(RuntimeError):
    """The set cannot be built (the sdist cannot be fetched or is not the pinned one, its tests fail)."""


@dataclass(frozen=True)
class Mutant:
    module: str
    mutation: Mutation
    fail_to_pass: list[str]
    pass_to_pass: list[str]

    @property
    def instance_id(self) -> str:
        return f"{PACKAGE}__{self.mutation.function}__{self.mutation.mutator}__L{self.mutation.line}"


def check_sdist(sdist: Path) -> Path:
    """`sdist` when it is the pinned file (its sha256), else BuildError."""
    if not sdist.is_file():
        raise BuildError(f"no such sdist: {sdist}")
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise BuildError(f"{sdist.name} has sha256 {digest}, not the pinned {SDIST_SHA256}")
    return sdist


def fetch_sdist(dest: Path) -> Path:
    """more-itertools' pinned sdist from the package index (pip, as configured here), its hash checked."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet",
         "--dest", str(dest), f"{PACKAGE}=={VERSION}"],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    sdist = dest / f"{ROOT}.tar.gz"
    if done.returncode != 0 or not sdist.is_file():
        raise BuildError(f"pip download {PACKAGE}=={VERSION} failed: {done.stderr.strip()[-500:]}")
    return check_sdist(sdist)


def _drop_methods(source: str, methods: list[tuple[str, str]]) -> str:
    """The test module without the named test methods (their whole lines)."""
    lines = source.splitlines(keepends=True)
    doomed: set[int] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and (node.name, item.name) in methods:
                    first = min([item.lineno, *(d.lineno for d in item.decorator_list)])
                    doomed.update(range(first - 1, item.end_lineno))
    return "".join(line for number, line in enumerate(lines) if number not in doomed)


def pristine_tree(sdist: Path, dest: Path) -> None:
    """The library's package, tests and licence from the sdist into `dest` (slow tests left out)."""
    with tarfile.open(sdist) as tar:
        members = [
            member for member in tar.getmembers()
            if any(member.name.removeprefix(f"{ROOT}/").startswith(kept) for kept in KEPT)
        ]  # fmt: skip
        tar.extractall(dest, members=members, filter="data")
    for path in (dest / ROOT).iterdir():
        path.rename(dest / path.name)
    (dest / ROOT).rmdir()
    for test_file, methods in SLOW_TESTS.items():
        (dest / test_file).write_text(_drop_methods((dest / test_file).read_text(), methods))


def run_tests(tree: Path, test_file: str) -> dict[str, TestStatus]:
    """Every test of `test_file` and its status, run as the grader runs tests (sandboxed, isolated pytest,
    junit XML), on a copy of `tree`. A run past its wall clock has no results."""
    with tempfile.TemporaryDirectory(prefix="otel-rl-minismith-run-") as scratch:
        copy, out = Path(scratch, "tree"), Path(scratch, "out")
        shutil.copytree(tree, copy)
        out.mkdir()
        sandbox.hand_over(Path(scratch))
        nonce = secrets.token_hex(16)
        binds = (sandbox.Bind(out, "/grader", writable=True),)
        command = pytest_command([test_file], nonce=nonce)
        done = sandbox.run(copy, command, limits=LIMITS, binds=binds, env=PYTEST_ENV)
        junit = out / "junit.xml"
        if done.timed_out or not junit.is_file():
            return {}
        try:
            return read_junit(junit.read_bytes(), nonce=nonce)
        except ElementTree.ParseError:
            return {}


def _candidates(tree: Path, rng: random.Random) -> list[tuple[str, Mutation]]:
    """Mutations of public functions the hidden test module names, in the seed's order."""
    found = []
    for module, test_file in MODULES.items():
        tests = (tree / test_file).read_text()
        sites = mutations((tree / module).read_text())
        names = {mutation.function for mutation in sites if not mutation.function.startswith("_")}
        named = {name for name in names if re.search(rf"\b{re.escape(name)}\b", tests)}
        found += [(module, mutation) for mutation in sites if mutation.function in named]
    rng.shuffle(found)
    return found


def find_mutants(tree: Path, *, seed: int, count: int) -> list[Mutant]:
    """Up to `count` mutants, at most one a function, each failing at least one test that passes on the
    pristine tree. Deterministic for a seed (the tests' outcomes decide, and they are deterministic)."""
    baselines: dict[str, dict[str, TestStatus]] = {}
    found: list[Mutant] = []
    used: set[tuple[str, str]] = set()
    tries = 0
    for module, mutation in _candidates(tree, random.Random(seed)):
        if len(found) >= count or tries >= count * TRIES_PER_TASK:
            break
        changed = mutant((tree / module).read_text(), mutation)
        if (module, mutation.function) in used or changed is None:
            continue
        tries += 1
        test_file = MODULES[module]
        if test_file not in baselines:
            baselines[test_file] = run_tests(tree, test_file)
            if not baselines[test_file]:
                raise BuildError(f"{test_file} gave no results on the pristine {PACKAGE} {VERSION}")
        passing = [test for test, status in baselines[test_file].items() if status == "passed"]
        with tempfile.TemporaryDirectory(prefix="otel-rl-minismith-mutant-") as scratch:
            mutant_tree = Path(scratch, "tree")
            shutil.copytree(tree, mutant_tree)
            (mutant_tree / module).write_text(changed)
            after = run_tests(mutant_tree, test_file)
        fail_to_pass = [test for test in passing if after.get(test) != "passed"]
        if not after or not fail_to_pass:
            continue  # hung, or no test notices it: not a task
        pass_to_pass = [test for test in passing if after.get(test) == "passed"]
        found.append(Mutant(module, mutation, fail_to_pass, pass_to_pass))
        used.add((module, mutation.function))
    return found


def _staged_diff(repo: Path, path: str, content: str | None) -> str:
    """The diff that writes `content` at `path` (None: removes it) over the repository's commit."""
    target = repo / path
    if content is None:
        target.unlink()
    else:
        target.write_text(content)
    git(repo, "add", "-A")
    diff = git(repo, "diff", "--cached", "--no-renames", "HEAD").decode()
    git(repo, "reset", "-q", "--hard", "HEAD")
    return diff


def build_task(tree: Path, mutant: Mutant, folder: Path, *, repo_path: str) -> dict:
    """Write the mutant's repository (its hidden test module left out) into `folder`; its task record."""
    test_file = MODULES[mutant.module]
    shutil.copytree(tree, folder)
    pristine_source = (tree / mutant.module).read_text()
    (folder / mutant.module).write_text(apply(pristine_source, mutant.mutation))
    hidden = (folder / test_file).read_text()
    (folder / test_file).unlink()
    base_commit = snapshot_commit(folder)
    with tempfile.TemporaryDirectory(prefix="otel-rl-minismith-diff-") as scratch:
        repo = Path(scratch)
        shutil.copytree(folder, repo, dirs_exist_ok=True)
        git(repo, "init", "-q", "--template=", "--initial-branch=main")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "--no-verify", "-m", "snapshot")
        patch = _staged_diff(repo, mutant.module, pristine_source)
        test_patch = _staged_diff(repo, test_file, hidden)
    return {
        "instance_id": mutant.instance_id,
        "repo": UPSTREAM,
        "base_commit": base_commit,
        "problem_statement": problem_statement(mutant),
        "FAIL_TO_PASS": mutant.fail_to_pass,
        "PASS_TO_PASS": mutant.pass_to_pass,
        "test_patch": test_patch,
        "patch": patch,
        "repo_path": repo_path,
    }


def problem_statement(mutant: Mutant) -> str:
    name = mutant.mutation.function
    return (
        f"`{name}` in `{mutant.module}` ({PACKAGE} {VERSION}) no longer does what its docstring says: "
        f"{len(mutant.fail_to_pass)} of the library's tests of it fail. Find the bug and fix it in the "
        "library's code; the tests are not yours to change."
    )


def build(out: Path, *, seed: int = 0, count: int = DEFAULT_COUNT, sdist: Path | None = None) -> Path:
    """Write the task file `out`, its repositories beside it (`<out stem>/`), and a dataset card
    (`<out stem>.card.md`). The same seed and count give the same bytes. `sdist`: the pinned sdist already
    on disk (offline); None fetches it from the package index."""
    if not 1 <= count <= MAX_COUNT:
        raise BuildError(f"--count {count}: between 1 and {MAX_COUNT}")
    repos = out.parent / out.stem
    if repos.exists():
        # A rebuild replaces its own repositories, never a folder of the user's that happens to have the name.
        if any(not FOLDER_NAME.fullmatch(entry.name) for entry in repos.iterdir()):
            raise BuildError(f"{repos} exists and holds other files: choose another --out")
        shutil.rmtree(repos)
    with tempfile.TemporaryDirectory(prefix="otel-rl-minismith-") as scratch:
        tree = Path(scratch, "pristine")
        pristine_tree(check_sdist(sdist) if sdist else fetch_sdist(Path(scratch)), tree)
        mutants = find_mutants(tree, seed=seed, count=count)
        repos.mkdir(parents=True)
        lines = []
        for mutant in mutants:
            name = mutant.instance_id
            lines.append(json.dumps(build_task(tree, mutant, repos / name, repo_path=f"{out.stem}/{name}")))
    out.write_text("".join(line + "\n" for line in lines))
    card = out.parent / f"{out.stem}.card.md"
    card.write_text(dataset_card(out, mutants, seed=seed, count=count))
    return card


def dataset_card(out: Path, mutants: list[Mutant], *, seed: int, count: int) -> str:
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    by_mutator = json.dumps(dict(sorted(Counter(mutant.mutation.mutator for mutant in mutants).items())))
    by_module = json.dumps(dict(sorted(Counter(mutant.module for mutant in mutants).items())))
    f2p = sum(len(mutant.fail_to_pass) for mutant in mutants)
    p2p = sum(len(mutant.pass_to_pass) for mutant in mutants)
    slow = ", ".join(f"{file}::{cls}::{test}" for file, tests in SLOW_TESTS.items() for cls, test in tests)
    return f"""# {out.name}: mini-smith, bugs injected into {PACKAGE} {VERSION}

- Tasks: {len(mutants)} (asked for {count}; seed {seed}), instance ids `{PACKAGE}__FUNCTION__MUTATOR__LLINE`.
- By mutator: {by_mutator}; by module: {by_module}.
- Tests: {f2p} FAIL_TO_PASS and {p2p} PASS_TO_PASS ids in all.
- Source: the sdist `{ROOT}.tar.gz` from PyPI (sha256 `{SDIST_SHA256}`), its package `more_itertools/`,
  its tests `tests/`, its `LICENSE` and `README.rst`. Licence: MIT (Erik Rose and contributors); the tasks'
  repositories are modified copies of it and keep its LICENSE.
- Left out of every task's tests: {slow} (27 s here, more than the rest of its module).
- Bug: one AST mutation of one top-level function the hidden tests name (otel-rl's own mutators,
  otel_rl/coding/mutate.py), at most one task a function, sites drawn in the order of `random.Random({seed})`.
- Hidden tests (`test_patch`): the test module of the mutated module ({", ".join(MODULES.values())}); the
  other test module stays in the repository, visible.
- FAIL_TO_PASS: tests of that module passing on the pristine library and not on the mutant; PASS_TO_PASS:
  passing on both. Both found by running the module's tests in the sandbox, as the grader runs them.
- Gold patch (`patch`): the inverse of the mutation.
- sha256 of {out.name}: `{digest}`
"""
