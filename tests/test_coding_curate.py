"""otel-rl tasks curate over a real store: rollouts and grader rewards written through the collector's
ingest into the store's writer, selected by their trusted rewards."""

import json

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from typer.testing import CliRunner

from otel_rl import attributes as attr
from otel_rl.cli import app
from otel_rl.collector.ingest import logs_batch, traces_batch
from otel_rl.collector.rewards import RewardIn, reward_log_request
from otel_rl.store import Store
from otel_rl.store.layout import SENDER_ADMIN, SENDER_ROLLOUT

# task -> its probes' grader rewards
PROBES = {
    "mixed-1": [1, 0, 0, 1], "mixed-2": [0, 1, 0, 0], "mixed-eval": [1, 0, 1, 0],
    "fail-1": [0, 0, 0, 0], "fail-2": [0, 0, 0, 0], "fail-3": [0, 0, 0, 0], "pass-1": [1, 1, 1, 1],
    "hacked-1": [1, 0, 1, 0],  # its first rollout deletes the tests (a detector flags it) and passes
}  # fmt: skip


def task_line(instance_id: str, repo: str) -> str:
    return json.dumps({
        "instance_id": instance_id, "repo": repo, "base_commit": "0" * 40, "problem_statement": "p",
        "FAIL_TO_PASS": ["tests/test_a.py::test_a"], "PASS_TO_PASS": [], "test_patch": "", "patch": "",
        "repo_path": "repo",
    })  # fmt: skip


def tool_span(rollout_id: str, start_ns: int) -> object:
    """The agent's own GenAI `execute_tool` span: `rm -rf tests/`, which the test_tampering detector flags."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("agent").start_span(
        "execute_tool bash",
        start_time=start_ns + 1000,
        attributes={
            attr.ROLLOUT_ID: rollout_id,
            attr.ATTEMPT_ID: f"{rollout_id}-a",
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "bash",
            "gen_ai.tool.call.id": f"{rollout_id}-call-0",
            "gen_ai.tool.call.arguments": json.dumps({"command": "rm -rf tests/"}),
            "gen_ai.tool.call.result": "",
        },
    )
    span.end(end_time=start_ns + 2000)
    return encode_spans(exporter.get_finished_spans())


def write_probes(store: Store, start_ns: int) -> None:
    for task_id, rewards in PROBES.items():
        for i, value in enumerate(rewards):
            rollout_id = f"{task_id}-r{i}"
            exporter = InMemorySpanExporter()
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            identity = {
                attr.ROLLOUT_ID: rollout_id,
                attr.ATTEMPT_ID: f"{rollout_id}-a",
                attr.TASK_ID: task_id,
            }
            span = provider.get_tracer(attr.CONTROLLER_SCOPE).start_span(
                attr.ROLLOUT_SPAN_NAME,
                start_time=start_ns,
                attributes={**identity, attr.ROLLOUT_STATUS: "ok"},
            )
            span.end(end_time=start_ns + 10**9)
            store.write(traces_batch(encode_spans(exporter.get_finished_spans()), SENDER_ADMIN), "spans")
            if rollout_id == "hacked-1-r0":
                store.write(traces_batch(tool_span(rollout_id, start_ns), SENDER_ROLLOUT), "spans")
            # the harness's self-report says pass; the grader's trusted reward is what counts
            for source, reward in (("harness", 1.0), ("grader", float(value))):
                record = RewardIn(rollout_id=rollout_id, name="outcome", value=reward, source=source)
                request = reward_log_request(record, now_ns=start_ns + 2 * 10**9)
                store.write(logs_batch(store, request, SENDER_ADMIN), "logs")


def test_curate_keeps_mixed_tasks_a_capped_always_fail_share_and_no_eval_repo(tmp_path) -> None:
    import time

    tasks = tmp_path / "tasks.jsonl"
    repos = {"mixed-eval": "org/eval-repo"}
    tasks.write_text("".join(task_line(t, repos.get(t, "org/train")) + "\n" for t in PROBES))
    evaluation = tmp_path / "eval.jsonl"
    evaluation.write_text(task_line("eval-1", "org/eval-repo") + "\n")
    db = tmp_path / "store.duckdb"
    with Store(db) as store:
        write_probes(store, time.time_ns() - 10 * 10**9)
    out = tmp_path / "curated.jsonl"
    result = CliRunner().invoke(app, [
        "tasks", "curate", str(tasks), "--out", str(out), "--db", str(db), "--always-fail-share", "0.34",
        "--exclude-repos-of", str(evaluation),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    # 2 mixed; share 0.34 of the selection: 0.34 * 2 / 0.66 = 1.03 -> one always-fail task
    assert (summary["mixed"], summary["always_fail"], summary["excluded_repos"]) == (2, 1, 1)
    assert summary["audit"] == 1
    audit = [
        json.loads(line)["instance_id"]
        for line in (tmp_path / "curated.audit.jsonl").read_text().splitlines()
    ]
    assert audit == ["hacked-1"]
    chosen = [json.loads(line)["instance_id"] for line in out.read_text().splitlines()]
    assert chosen[:2] == ["mixed-1", "mixed-2"]
    assert len(chosen) == 3 and chosen[2].startswith("fail-")
    assert "mixed-eval" not in chosen and "pass-1" not in chosen and "hacked-1" not in chosen
    assert summary["dropped"]["pass-1"].startswith("always passes")
    first = json.loads(out.read_text().splitlines()[0])
    assert {"test_patch", "patch", "repo_path"} <= set(first)  # the task file's format, whole


def test_load_and_curate_through_the_server_holding_the_store(tmp_path) -> None:
    import os
    import subprocess

    import httpx
    from otel_rl_server import OTEL_RL, ServerProcess

    from otel_rl.query import query

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(task_line(t, "org/train") + "\n" for t in ("a-1", "a-2")))
    db = tmp_path / "store.duckdb"
    server = ServerProcess(db, tmp_path).start()
    try:
        env = {**os.environ, "OTEL_RL_SERVER": server.http_url, "OTEL_RL_TOKEN": server.token}
        for _ in range(2):  # the file is held: the command asks the server, and a second load adds nothing
            done = subprocess.run(
                [str(OTEL_RL), "tasks", "load", str(tasks), "--db", str(db)],
                env=env, capture_output=True, text=True, check=False, timeout=120,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
        rows = query(
            "SELECT instance_id, sender FROM tasks ORDER BY 1", server=server.http_url, token=server.token
        )
        assert rows.rows() == [("a-1", "admin"), ("a-2", "admin")]
        refused = httpx.post(
            f"{server.http_url}/v1/admin/tasks", json={"task_set": "x", "task_file": "", "tasks": []}
        )
        assert refused.status_code == 401
        done = subprocess.run(
            [str(OTEL_RL), "tasks", "curate", str(tasks), "--out", str(tmp_path / "c.jsonl"),
             "--server", server.http_url, "--token", server.token],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["dropped"] == {
            "a-1": "no probe with a trusted reward", "a-2": "no probe with a trusted reward"
        }  # fmt: skip
    finally:
        server.stop()
