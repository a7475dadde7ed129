"""The GPU check (bench/gpu/verl_engine.sh) proven on CPU: the carried wheels, installed with no index over a
stand-in of the GPU machine (its packages at the lock's versions, and no Ray, vLLM or DuckDB), run verl's own
FSDP2 engine beside the local trainer on the same batches, and the two agree on every update."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu" / "verl_engine.sh"
CARRY = ROOT / "build" / "gpu-carry-cpu"


@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("gpu-check") / "verl_engine.json"
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        [SCRIPT, "--cpu", "--tiny", "--json", out],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, (
        f"{SCRIPT} --cpu --tiny exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    )
    return json.loads(out.read_text()), done.stdout


def test_verl_engine_and_local_trainer_make_the_same_updates(cpu_check):
    result, _ = cpu_check
    local, verl = result["local"]["updates"], result["verl"]["updates"]
    assert len(local) == len(verl) == 3
    for i, (ours, theirs) in enumerate(zip(local, verl, strict=True)):
        assert theirs["loss"] == pytest.approx(ours["loss"], abs=1e-5), f"update {i + 1}"
        assert theirs["grad_norm"] == pytest.approx(ours["grad_norm"], rel=1e-4), f"update {i + 1}"
        assert ours["tokens_per_s"] > 0 and theirs["tokens_per_s"] > 0
    # the loss depends on the weights (the served log-probs' ratio), so equal losses mean equal trajectories
    assert len({round(u["loss"], 4) for u in local}) == 3


def test_the_check_runs_without_ray_vllm_or_duckdb(cpu_check):
    result, _ = cpu_check
    assert result["imported"]["vllm"] is None and result["imported"]["duckdb"] is None
    assert Path(result["imported"]["ray"]).is_relative_to(ROOT / "bench" / "gpu" / "fixtures")
    carried = [wheel.name.lower() for wheel in (CARRY / "wheels").iterdir()]
    assert any(name.startswith("verl-0.9.1-") for name in carried)
    assert not [name for name in carried if name.startswith(("ray-", "vllm", "duckdb-"))]
    machine = (CARRY / "machine.txt").read_text().lower()
    assert "torch==" in machine and not re.search(r"^(ray|vllm|duckdb)", machine, re.M)


def test_the_carry_fits_the_device_tools_limit(cpu_check):
    _, stdout = cpu_check
    [total] = re.findall(r"total carried size: ([\d.]+) MiB", stdout)
    assert 0 < float(total) <= 64
