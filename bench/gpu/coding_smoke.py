"""The coding recipe's smoke: a random-init policy of Qwen2.5-0.5B's shape, two GRPO steps on mini-smith tasks
through the whole real path, and the recipe's metrics (docs/coding.md, "The metrics it reports") read back.

    bench/gpu/coding_smoke.py [--out FILE]     on a GPU machine with otel-rl, bubblewrap and its CUDA vLLM
                                               environment (`otel-rl vllm setup`); $OUT/coding_smoke.json
    bench/gpu/coding_smoke.py --cpu --tiny     here: the same on vLLM's CPU build and the tiny model

Not on the device tool's lent machine as it is: it has no vLLM, and vLLM's own environment (its vllm package
alone is 517 MiB installed, the CPU build) does not travel in the tool's 64 MiB.

What runs: `otel-rl tasks build mini-smith` from the pinned sdist in tests/data (offline), `otel-rl tasks
validate` (the canaries), `otel-rl serve --model` (the gateway in front of vLLM, the store), and the online
loop (`run_online`, the local trainer) with the recipe's algorithm: GRPO, no KL, clip-higher, the grader's
reward only, flagged rollouts screened, an evaluation before the first step and after the last. Every attempt
runs the coding demo's tool-calling agent (otel_rl/coding/toy_agent.py, the one harness here that needs
neither a CLI install nor the network) in the bubblewrap sandbox, and is graded outside it. Each metric but
the canaries' is the SQL docs/coding.md gives, over the store's views, scoped to the groups the run trained
on (and its evaluations); a metric with nothing to measure is null with the reason. A random policy solves
nothing and rarely calls a tool: the figures prove the path runs and reads back, not that anything is learned.
"""

import argparse
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(ROOT), str(HERE)]

from colocated import build_model  # noqa: E402

from otel_rl.coding import toy_agent  # noqa: E402
from otel_rl.coding.validate import CANARIES  # noqa: E402
from otel_rl.gateway.vllm import free_ports  # noqa: E402

SDIST = ROOT / "tests" / "data" / "more_itertools-10.8.0.tar.gz"
# This seed's first tasks are in recipes.py, whose test module runs in about 3 s (more.py's take 10-20 s)
TASK_SEED = 275
AGENT = Path(toy_agent.__file__).resolve()
OTEL_RL = Path(sys.executable).parent / "otel-rl"


def sizes(args: argparse.Namespace) -> dict[str, int]:
    """How much runs: the proof here is small (2 shared cores); the GPU machine runs groups of 4."""
    if args.tiny:
        return {"tasks": 2, "group_size": 2, "groups_per_step": 2, "concurrency": 4}
    return {"tasks": 2, "group_size": 4, "groups_per_step": 2, "concurrency": 8}


def build_tasks(workdir: Path, count: int) -> Path:
    """mini-smith tasks from the pinned sdist (no network), and the loop's task list: their ids."""
    tasks = workdir / "ms.jsonl"
    done = subprocess.run(
        [OTEL_RL, "tasks", "build", "mini-smith", "--out", tasks, "--seed", str(TASK_SEED),
         "--count", str(count), "--sdist", SDIST],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"otel-rl tasks build mini-smith exited {done.returncode}:\n{done.stderr[-3000:]}")
    ids = [json.loads(line)["instance_id"] for line in tasks.read_text().splitlines() if line.strip()]
    (workdir / "ids.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))
    return tasks


def start_validation(tasks: Path, workdir: Path) -> subprocess.Popen:
    """`otel-rl tasks validate`: gold, empty and every canary graded per task; runs while vLLM starts."""
    with (workdir / "validate.jsonl").open("w") as out, (workdir / "validate.log").open("w") as log:
        return subprocess.Popen([OTEL_RL, "tasks", "validate", tasks], stdout=out, stderr=log)


def canary_cheat_rate(validation: subprocess.Popen, workdir: Path) -> dict[str, Any]:
    """The share of task × canary pairs whose reason is `canary NAME scores 1` (exit 1: a task is invalid)."""
    if validation.wait(900) not in (0, 1):
        log = (workdir / "validate.log").read_text()[-2000:]
        return {"value": None, "reason": f"otel-rl tasks validate exited {validation.returncode}: {log}"}
    lines = [json.loads(line) for line in (workdir / "validate.jsonl").read_text().splitlines()]
    cheats = [m for line in lines for r in line["reasons"] if (m := re.match(r"canary (\S+) scores 1", r))]
    pairs = len(lines) * len(CANARIES)
    return {
        "value": len(cheats) / pairs if pairs else None,
        "pairs": pairs,
        "cheats": [m.group(1) for m in cheats],
        "invalid_tasks": [line["instance_id"] for line in lines if not line["valid"]],
        **({} if pairs else {"reason": "otel-rl tasks validate printed no task"}),
    }


def start_server(model: Path, workdir: Path, token: str, cpu: bool) -> tuple[subprocess.Popen, str]:
    """`otel-rl serve --model` (the gateway in front of a local vLLM, the store), once it is healthy."""
    port, grpc_port = free_ports(2)
    args = [OTEL_RL, "serve", "--db", workdir / "otel_rl.duckdb", "--model", model,
            "--http-port", str(port), "--grpc-port", str(grpc_port)]  # fmt: skip
    if not cpu:  # the trainer shares the GPU: a 0.5B model's float32 weights and AdamW state, ~10 GB
        args.append("--vllm-arg=--gpu-memory-utilization=0.4")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | {"OTEL_RL_TOKEN": token}
    with (workdir / "server.log").open("wb") as log:
        server = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return server, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop(server)
    raise RuntimeError(f"otel-rl serve did not start:\n{(workdir / 'server.log').read_text()[-3000:]}")


def stop(server: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (its vLLM too), SIGKILL after a minute."""
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    except ProcessLookupError:  # the group is gone already
        server.wait()


def train_config(model: Path, workdir: Path, url: str, token: str, cpu: bool, size: dict[str, int]):
    """examples/coding/recipe-9b.yaml's algorithm and reward, on one machine: two steps, small groups."""
    from otel_rl.train.config import config_from_dict

    ids = str(workdir / "ids.jsonl")
    return config_from_dict(
        {
            "model": str(model),
            "output_dir": str(workdir / "run"),
            "steps": 2,
            "seed": 0,
            "device": "cpu" if cpu else "cuda",
            "server": {"url": url, "token": token},
            "optim": {"lr": 1e-6, "micro_batch_size": 4},
            "algorithm": {
                "advantage_estimator": "grpo",
                "clip_ratio_low": 0.2,
                "clip_ratio_high": 0.28,
                "kl_coef": 0.0,
                "group_size": size["group_size"],
                "groups_per_step": size["groups_per_step"],
                "max_staleness": 0,  # two on-policy steps: no group launched ahead is left over
                "screen_flagged": True,
            },
            "reward": {"trusted_sources": ["grader"]},
            "online": {
                "tasks": ids,
                "harness": [sys.executable, str(AGENT)],
                "concurrency": size["concurrency"],
                "timeout_s": 300,
                "nice": 10 if cpu else 0,  # on 2 cores the trainer goes first
            },
            "eval": {"tasks": ids, "every": 0},  # before the first step and after the last
            "controller": {
                "coding": {
                    "tasks": str(workdir / "ms.jsonl"),
                    "binds": [str(AGENT)],  # the agent script alone: no other file of this checkout
                    "cpu_seconds": 120,
                    "wall_seconds": 240,
                    "grader_cpu_seconds": 120,
                    "grader_wall_seconds": 240,
                }
            },
        }
    )


# docs/coding.md's SQL for each metric, over the groups the run trained on (its step spans' group_ids): the
# loop cancels the groups it launched ahead when it ends, and a cancelled attempt is `infra_error`, which
# the docs' SQL over every rollout would count as a sandbox failure. `$run`: the run's id, bound.
STEP = (
    "FROM spans WHERE name = 'otel_rl.train.step' AND vouched(sender) "
    "AND attributes ->> 'otel_rl.train.run_id' = $run"
)
TRAINED = f"""SELECT unnest(from_json(attributes -> 'otel_rl.train.group_ids', '["VARCHAR"]')) {STEP}"""
TRAIN = f"FROM rollouts WHERE split = 'train' AND group_id IN ({TRAINED})"
GRADED = f"SELECT rollout_id {TRAIN} AND outcome_reward IS NOT NULL"
SQL = {
    "true_pass_at_1": "SELECT attributes ->> 'otel_rl.train.step' AS step, avg(TRY_CAST(attributes ->> "
    "'otel_rl.train.success_rate' AS DOUBLE)) AS pass_at_1, count(*) AS samples FROM spans WHERE name = "
    "'otel_rl.train.eval' AND vouched(sender) AND attributes ->> 'otel_rl.train.run_id' = $run "
    "GROUP BY 1 ORDER BY TRY_CAST(step AS INTEGER)",
    "detectors": "SELECT substr(view_name, 8) AS detector FROM duckdb_views() WHERE schema_name = 'main' "
    "AND starts_with(view_name, 'detect_') ORDER BY 1",
    "hack_rate": f"WITH graded AS ({GRADED}) SELECT detector, count(DISTINCT rollout_id) / (SELECT count(*) "
    "FROM graded) AS hack_rate FROM detections WHERE rollout_id IN (SELECT rollout_id FROM graded) "
    "GROUP BY detector",
    "graded": f"SELECT count(*) AS n FROM ({GRADED})",
    "proxy_true_gap": "SELECT avg(outcome_rewards_by_source['harness']) - avg(outcome_rewards_by_source"
    f"['grader']) AS gap, count(*) AS n {TRAIN} AND outcome_rewards_by_source['harness'] IS NOT NULL "
    "AND outcome_rewards_by_source['grader'] IS NOT NULL",
    "steps": "SELECT sum(TRY_CAST(attributes ->> 'otel_rl.train.screened' AS DOUBLE)) AS screened, "
    "sum(TRY_CAST(attributes ->> 'otel_rl.train.rollouts' AS DOUBLE)) AS rollouts, "
    "avg(TRY_CAST(attributes ->> 'otel_rl.train.trainer.mismatch' AS DOUBLE)) AS mismatch, "
    "avg(TRY_CAST(attributes ->> 'otel_rl.train.trainer.is_weight_mean' AS DOUBLE)) AS is_weight_mean, "
    f"count(*) AS n {STEP}",
    "mixed_group_fraction": "SELECT avg((lo < hi)::INTEGER) AS value, count(*) AS n FROM (SELECT group_id, "
    f"min(outcome_reward) AS lo, max(outcome_reward) AS hi {TRAIN} AND outcome_reward IS NOT NULL "
    "GROUP BY group_id)",
    "truncation_rate": "SELECT avg((status IN ('truncated', 'timeout'))::INTEGER) AS value, "
    f"count(*) AS n {TRAIN}",
    # the evaluations' rollouts too: the loop waits for every one of them
    "sandbox_failure_rate": "SELECT avg((status = 'infra_error')::INTEGER) AS value, count(*) AS n "
    f"FROM rollouts WHERE split = 'val' OR group_id IN ({TRAINED})",
    "statuses": f"SELECT split, status, split = 'val' OR group_id IN ({TRAINED}) AS counted, count(*) AS n "
    "FROM rollouts GROUP BY ALL ORDER BY ALL",
}


def fraction(value: Any, n: int, reason: str) -> dict[str, Any]:
    """A metric's entry: the value over n, or null with the reason when there is nothing to measure."""
    return {"value": float(value), "n": n} if n and value is not None else {"value": None, "reason": reason}


def read_metrics(store: Path, run_id: str) -> dict[str, Any]:
    """Every metric but the canaries', from the store's views (the server stopped: the file is read)."""
    from otel_rl.query import query

    def rows(name: str) -> list[dict[str, Any]]:
        return query(SQL[name], {"run": run_id} if "$run" in SQL[name] else None, db=store).to_dicts()

    evals = rows("true_pass_at_1")
    last = evals[-1] if evals and evals[-1]["step"] != "0" else {"pass_at_1": None, "samples": 0}
    graded = rows("graded")[0]["n"]
    hits = {row["detector"]: row["hack_rate"] for row in rows("hack_rate")}
    gap, steps = rows("proxy_true_gap")[0], rows("steps")[0]
    mixed, truncated = rows("mixed_group_fraction")[0], rows("truncation_rate")[0]
    failed = rows("sandbox_failure_rate")[0]
    return {
        # after the last step: the mean of the eval commands' success_rate (n: how many ran)
        "true_pass_at_1": fraction(last["pass_at_1"], last["samples"], "no eval span of the run after a step")
        | {"per_eval": evals},
        "hack_rate_per_detector": {
            row["detector"]: fraction(hits.get(row["detector"], 0.0), graded, "no graded train rollout")
            for row in rows("detectors")
        },
        # only a harness that reports its own check has a proxy (the toy agent does: pytest in its tree)
        "proxy_true_gap": fraction(
            gap["gap"], gap["n"], "no train rollout with both a harness and a grader reward"
        ),
        "screened_fraction": fraction(
            steps["screened"] / steps["rollouts"] if steps["rollouts"] else None,
            int(steps["rollouts"] or 0),
            "no step span of the run",
        ),
        "mixed_group_fraction": fraction(mixed["value"], mixed["n"], "no graded train group"),
        "truncation_rate": fraction(truncated["value"], truncated["n"], "no train rollout"),
        "sandbox_failure_rate": fraction(failed["value"], failed["n"], "no rollout"),
        # mean |trainer − served logprob| per token, and the importance weights' mean (1 when aligned)
        "token_alignment": {
            "mismatch": fraction(steps["mismatch"], steps["n"], "no trainer mismatch on the step spans"),
            "is_weight_mean": fraction(steps["is_weight_mean"], steps["n"], "no IS weight on the step spans"),
        },
        "rollouts_by_status": rows("statuses"),
    }


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from otel_rl.train.online import run_online

    started, timings = time.monotonic(), {}
    size = sizes(args)
    model = build_model(workdir, args.tiny)
    tasks = build_tasks(workdir, size["tasks"])
    timings["setup_s"] = time.monotonic() - started
    validation = start_validation(tasks, workdir)
    token = secrets.token_urlsafe(24)
    try:
        server, url = start_server(model, workdir, token, args.cpu)
        timings["server_start_s"] = time.monotonic() - started - timings["setup_s"]
        try:
            stage = time.monotonic()
            result = run_online(train_config(model, workdir, url, token, args.cpu, size))
            timings["train_s"] = time.monotonic() - stage
        finally:
            stop(server)
        canaries = canary_cheat_rate(validation, workdir)
    finally:
        if validation.poll() is None:
            validation.kill()
            validation.wait()
    metrics = read_metrics(workdir / "otel_rl.duckdb", result.run_id)
    metrics["canary_cheat_rate"] = canaries
    return {
        "device": "cpu" if args.cpu else "cuda",
        "model": "tiny" if args.tiny else "qwen2.5-0.5b-shape (random, bfloat16)",
        "sizes": size,
        "run_id": result.run_id,
        "steps": [
            {
                "step": s.step,
                "rollouts": s.rollouts,
                "screened": s.screened,
                "wall_s": s.wall_s,
                "train_s": s.train_s,
            }
            for s in result.steps
        ],  # fmt: skip
        "metrics": metrics,
        "timings": timings | {"wall_s": time.monotonic() - started},
    }


LABELS = (
    ("proxy-true gap", "proxy_true_gap"),
    ("canary cheat rate", "canary_cheat_rate"),
    ("screened fraction", "screened_fraction"),
    ("mixed-group fraction", "mixed_group_fraction"),
    ("truncation rate", "truncation_rate"),
    ("sandbox-failure rate", "sandbox_failure_rate"),
)


def table(results: dict[str, Any]) -> str:
    """The metrics, one line each: the value (or null and why) and what it is over."""
    m = results["metrics"]
    entries = [("true pass@1", m["true_pass_at_1"])]
    entries += [(f"hack rate: {name}", e) for name, e in m["hack_rate_per_detector"].items()]
    entries += [(label, m[key]) for label, key in LABELS]
    entries += [(f"token alignment: {k}", e) for k, e in m["token_alignment"].items()]

    def shown(entry: dict[str, Any]) -> str:
        if entry["value"] is None:
            return f"{'null':>8}  ({entry['reason']})"
        return f"{entry['value']:8.4g}  (n={entry.get('n', entry.get('pairs'))})"

    return "\n".join(f"{label:34} {shown(entry)}" for label, entry in entries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="vLLM's CPU build and the trainer on CPU")
    parser.add_argument("--tiny", action="store_true", help="the project's tiny model, not the 0.5B shape")
    parser.add_argument("--out", type=Path, help="the JSON results (default: $OUT/coding_smoke.json if set)")
    parser.add_argument("--workdir", type=Path, help="keep the run here (default: a temporary folder)")
    args = parser.parse_args()
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            parser.error("no CUDA device here: run with --cpu --tiny, or on a GPU machine")
    out = args.out or (Path(os.environ["OUT"]) / "coding_smoke.json" if os.environ.get("OUT") else None)
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=False)
        results = run(args, args.workdir.resolve())
    else:
        with tempfile.TemporaryDirectory(prefix="otel-rl-coding-smoke-") as workdir:
            results = run(args, Path(workdir))
    print(table(results))
    print(f"wall {results['timings']['wall_s']:.0f} s; timings {json.dumps(results['timings'])}")
    if out:
        out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
