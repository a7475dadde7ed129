"""The coding sandbox and grader against their bare equivalents, side by side, wall-clock medians.

1. Sandbox start to first command: `sandbox.run(workspace, ["true"])` (namespaces, mounts, rlimits, the
   identity switch, the started-gate), and with one host port forwarded in (the gateway's), against bare
   `bwrap --ro-bind / / -- true`.
2. Grading a task: `grade()` on the gold patch of HumanEval/0 (a pristine one-commit copy, the patch split
   and applied, hidden tests added, pytest in a new sandbox, junit read) against pytest alone on the same
   tests in an already prepared tree, with the same flags, outside any sandbox.
Aims (issue 28): the sandbox within 50 ms of bare bwrap; grading within 1.2x pytest alone.

Usage: python bench/coding.py [--runs 20]
"""

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from otel_rl.coding import sandbox
from otel_rl.coding.grader import PYTEST_ENV, add_hidden_tests, apply_agent_patch, grade
from otel_rl.coding.humaneval import build
from otel_rl.coding.tasks import load_tasks
from otel_rl.coding.workspace import make_workspace


def median_seconds(action, runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    limits = sandbox.Limits(cpu_seconds=60, wall_seconds=120)
    with tempfile.TemporaryDirectory(prefix="otel-rl-bench-") as scratch:
        root = Path(scratch)
        build(root / "he.jsonl", limit=1)
        task_set = load_tasks(root / "he.jsonl")
        task = task_set.tasks[0]
        workspace = make_workspace(task_set, task, root / "work")
        sandbox.hand_over(workspace)
        bwrap = shutil.which("bwrap") or "bwrap"
        ours = median_seconds(lambda: sandbox.run(workspace, ["true"], limits=limits), runs)
        with socket.create_server(("127.0.0.1", 0)) as gateway:
            port = gateway.getsockname()[1]
            run = lambda: sandbox.run(workspace, ["true"], limits=limits, forward=(port,))  # noqa: E731
            forwarding = median_seconds(run, runs)
        bare = median_seconds(
            lambda: subprocess.run([bwrap, "--ro-bind", "/", "/", "--", "true"], check=True), runs
        )

        tree = make_workspace(task_set, task, root / "prepared")
        apply_agent_patch(tree, task.patch)
        add_hidden_tests(tree, task.test_patch)
        files = sorted({test.split("::")[0] for test in task.expected_tests})
        pytest_alone = [sys.executable, "-I", "-B", "-m", "pytest", "-p", "no:cacheprovider", "-q",
                        "-o", f"pythonpath={tree}", f"--junitxml={root / 'alone.xml'}", *files]  # fmt: skip
        env = {"PATH": "/usr/bin:/bin", **PYTEST_ENV}
        alone = median_seconds(
            lambda: subprocess.run(pytest_alone, cwd=tree, env=env, capture_output=True), runs
        )
        assert grade(task_set, task, task.patch, limits=limits).reward == 1
        graded = median_seconds(lambda: grade(task_set, task, task.patch, limits=limits), runs)

    print(f"{'measure':<44}{'ours':>10}{'bare':>10}{'diff':>12}")
    print(f"{'sandbox start to first command (true)':<44}{ours * 1e3:>8.1f}ms{bare * 1e3:>8.1f}ms"
          f"{(ours - bare) * 1e3:>+10.1f}ms")  # fmt: skip
    print(f"{'  the same, one port forwarded in':<44}{forwarding * 1e3:>8.1f}ms{bare * 1e3:>8.1f}ms"
          f"{(forwarding - bare) * 1e3:>+10.1f}ms")  # fmt: skip
    print(f"{'grading HumanEval/0 gold vs pytest alone':<44}{graded * 1e3:>8.0f}ms{alone * 1e3:>8.0f}ms"
          f"{graded / alone:>11.2f}x")  # fmt: skip
    print(f"medians of {runs} runs each, wall clock")


if __name__ == "__main__":
    main()
