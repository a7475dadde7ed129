"""`otel-rl serve --model DIR --replicas 2` on real vLLM (CPU build, tiny model): two servers behind the
gateway, each on a core of its own, both receive calls and both are reloaded to each new policy version."""

import os
import time
from pathlib import Path

import httpx
import pytest
from otel_rl_server import ServerProcess

from otel_rl.gateway.vllm_env import vllm_python
from otel_rl.gateway.vllm_machine import this_machine
from otel_rl.tinymodel import init_model

CALLS = 6


def greedy_answers(server: ServerProcess, tag: str) -> list[tuple[str, list[int]]]:
    """CALLS greedy calls, one rollout each, one after the other: (rollout id, completion tokens)."""
    answers = []
    for n in range(CALLS):
        rollout = f"{tag}-{n}"
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "What is 37 + 48?"}],
            "max_tokens": 8,
            "temperature": 0,
            "return_token_ids": True,
        }
        headers = server.auth | {"x-otel-rl-rollout-id": rollout}
        url = f"{server.http_url}/v1/chat/completions"
        response = httpx.post(url, json=body, headers=headers, timeout=300)
        assert response.status_code == 200, response.text
        answers.append((rollout, response.json()["choices"][0]["token_ids"]))
    return answers


def served_by(server: ServerProcess, tag: str) -> dict[str, tuple[str, int]]:
    """Each of the tagged rollouts' call: the vLLM server that answered it and the policy version it ran under
    (the gateway's spans, once all are stored)."""
    sql = """
        SELECT attributes->>'otel_rl.rollout.id' AS rollout, attributes->>'otel_rl.server.url' AS url,
               CAST(attributes->>'otel_rl.policy.version' AS INTEGER) AS version
        FROM spans WHERE scope_name = 'otel_rl.gateway' AND attributes->>'otel_rl.rollout.id' LIKE $tag"""
    deadline = time.monotonic() + 60
    while True:
        rows = server.sql(sql, {"tag": f"{tag}-%"}).to_pylist()
        if len(rows) >= CALLS or time.monotonic() > deadline:
            return {row["rollout"]: (row["url"], row["version"]) for row in rows}
        time.sleep(0.2)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (the kernel's children lists, recursively)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in map(int, (task / "children").read_text().split()):
            found += [child, *descendants(child)]
    return found


def vllm_workers(server: ServerProcess) -> dict[int, tuple[set[int], int]]:
    """Each vLLM worker process under `otel-rl serve`: its CPU affinity, and the resident memory of its
    replica's processes (API server, engine core, worker) in bytes."""
    assert server.process is not None
    workers = {}
    for api in descendants(server.process.pid):
        if "vllm.entrypoints" not in Path(f"/proc/{api}/cmdline").read_text(errors="replace"):
            continue
        tree = [api, *descendants(api)]
        rss = sum(
            int(Path(f"/proc/{p}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") for p in tree
        )
        for pid in tree:
            if Path(f"/proc/{pid}/comm").read_text().startswith("VLLM::Worker"):
                workers[pid] = (os.sched_getaffinity(pid), rss)
    return workers


def test_two_replicas_share_the_calls_and_are_reloaded_together(tiny_model_dir: Path, tmp_path: Path):
    vllm_python()  # the vLLM environment must be built (make vllm-env)
    if this_machine().gpus or len(this_machine().cores) < 2:
        pytest.skip("two CPU replicas need a machine without a GPU and with 2 cores")
    checkpoint = init_model(tmp_path / "seed1", seed=1)
    server = ServerProcess(
        tmp_path / "store.duckdb", tmp_path, flags=("--model", str(tiny_model_dir), "--replicas", "2")
    )
    server.start(timeout=900)  # both replicas start together; on 2 busy cores that takes minutes
    try:
        policy_url = f"{server.http_url}/v1/admin/policy"
        policy = httpx.get(policy_url, headers=server.auth, timeout=10).json()
        replicas = {s["url"] for s in policy["servers"]}
        assert len(replicas) == 2
        workers = vllm_workers(server)
        print({pid: (sorted(cores), f"{rss / 2**30:.2f} GiB") for pid, (cores, rss) in workers.items()})
        [first, second] = [cores for cores, _ in workers.values()]
        assert first and second and not first & second  # each replica's worker on cores of its own

        before = greedy_answers(server, "before")
        calls = served_by(server, "before")
        assert {url for url, _ in calls.values()} == replicas  # both replicas received calls
        assert {version for _, version in calls.values()} == {0}
        assert len({tuple(tokens) for _, tokens in before}) == 1  # the same weights on both

        reloaded = httpx.post(
            policy_url, json={"version": 1, "checkpoint": str(checkpoint)}, headers=server.auth, timeout=600
        )
        assert reloaded.status_code == 200, reloaded.text
        outcome = {s["url"]: s for s in reloaded.json()["servers"]}
        assert set(outcome) == replicas and all(s["ok"] and s["weights_changed"] for s in outcome.values())

        after = greedy_answers(server, "after")
        calls = served_by(server, "after")
        assert {url for url, _ in calls.values()} == replicas
        assert {version for _, version in calls.values()} == {1}  # both serve the new version
        assert len({tuple(tokens) for _, tokens in after}) == 1 and after[0][1] != before[0][1]
    finally:
        server.stop(timeout=180)
