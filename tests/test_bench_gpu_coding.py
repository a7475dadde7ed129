"""The coding recipe's GPU smoke (bench/gpu/coding_smoke.py) proven on CPU: the tiny model, vLLM's CPU build
behind `otel-rl serve`, two GRPO steps on mini-smith tasks with every attempt in the bubblewrap sandbox and
graded outside it, and each metric of docs/coding.md read back from the store, a fraction or null with why."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu" / "coding_smoke.py"
DETECTORS = {"test_tampering", "exit_hack", "always_equal", "git_history", "network", "network_denied",
             "visible_test_literals", "grader_divergence", "diff_test_files"}  # fmt: skip
TASKS, GROUPS, GROUP_SIZE, CANARIES = 2, 2, 2, 7


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("coding-smoke") / "coding_smoke.json"
    done = subprocess.run(
        [sys.executable, SCRIPT, "--cpu", "--tiny", "--out", out],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return json.loads(out.read_text()), done.stdout


def entries(metrics: dict) -> dict[str, dict]:
    """Every reported figure, by name, each {value, n} or {value: None, reason}."""
    found = {name: metrics[name] for name in (
        "true_pass_at_1", "proxy_true_gap", "canary_cheat_rate", "screened_fraction", "mixed_group_fraction",
        "truncation_rate", "sandbox_failure_rate")}  # fmt: skip
    found |= {f"hack_rate:{name}": e for name, e in metrics["hack_rate_per_detector"].items()}
    return found | {f"token_alignment:{name}": e for name, e in metrics["token_alignment"].items()}


def test_every_metric_is_a_fraction_or_null_with_its_reason(smoke):
    results, stdout = smoke
    metrics = results["metrics"]
    assert set(metrics["hack_rate_per_detector"]) >= DETECTORS
    for name, entry in entries(metrics).items():
        value = entry["value"]
        assert value is None and entry["reason"] or isinstance(value, float), (name, entry)
        if name == "token_alignment:is_weight_mean":
            assert value == pytest.approx(1.0, abs=0.05), entry  # trainer and vLLM agree on the tokens
        elif name == "token_alignment:mismatch":
            assert 0 <= value < 0.1, entry  # the loop's own warning threshold (algorithm.mismatch_warning)
        elif value is not None:
            assert 0 <= value <= 1, (name, entry)
    for label in ("true pass@1", "hack rate: exit_hack", "proxy-true gap", "canary cheat rate",
                  "screened fraction", "mixed-group fraction", "truncation rate", "sandbox-failure rate",
                  "token alignment: mismatch"):  # fmt: skip
        assert label in stdout


def test_the_figures_are_over_the_run_that_happened(smoke):
    results, _ = smoke
    metrics = results["metrics"]
    trained = 2 * GROUPS * GROUP_SIZE  # two steps of two groups: what the rollout figures are over
    assert [step["rollouts"] for step in results["steps"]] == [GROUPS * GROUP_SIZE] * 2
    # every train rollout graded by the grader and self-checked by the agent: the gap is over all of them
    assert metrics["truncation_rate"]["n"] == metrics["proxy_true_gap"]["n"] == trained
    assert all(entry["n"] == trained for entry in metrics["hack_rate_per_detector"].values())
    assert metrics["mixed_group_fraction"]["n"] == 2 * GROUPS
    # an evaluation before the first step and after the last, each task once
    assert [row["step"] for row in metrics["true_pass_at_1"]["per_eval"]] == ["0", "2"]
    counted = {(r["split"], r["status"]): r["n"] for r in metrics["rollouts_by_status"] if r["counted"]}
    assert counted == {("train", "ok"): trained, ("val", "ok"): 2 * TASKS}  # the sandbox ran every attempt
    assert metrics["sandbox_failure_rate"] == {"value": 0.0, "n": trained + 2 * TASKS}
    canaries = metrics["canary_cheat_rate"]
    assert canaries["pairs"] == TASKS * CANARIES and canaries["value"] == 0 and not canaries["invalid_tasks"]
