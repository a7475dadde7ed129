"""`otel-rl export samples|sft` end to end: gateway spans, a controller rollout span and graders' rewards in a
real store, read back through the views by the CLI; and the read behind it (`load_inputs`) against
`llm_calls`."""

import json
import time
from functools import partial
from pathlib import Path

import polars as pl
import pytest
from opentelemetry.trace import Status, StatusCode
from typer.testing import CliRunner

from otel_rl import attributes as names
from otel_rl.cli import app
from otel_rl.collector.ingest import ingest_logs, ingest_traces
from otel_rl.collector.rewards import RewardIn, reward_log_request
from otel_rl.gateway.export import gateway_tracer_provider
from otel_rl.gateway.outputs import CallOutput, ChoiceOutput, ToolCallOutput
from otel_rl.gateway.recording import CallRecord, record_call
from otel_rl.query import query
from otel_rl.store import Store
from otel_rl.store.reads import CALL_COLUMNS, ROLLOUT_COLUMNS
from otel_rl.transforms.samples import load_inputs
from otel_rl.transforms.screening import FLAGS_COLUMN

QUESTION = [{"role": "user", "content": "What is 2+3?"}]
TOOL_CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "calc", "arguments": '{"expression": "2+3"}'},
}
AFTER_TOOL = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}]
AFTER_TOOL.append({"role": "tool", "tool_call_id": "c1", "content": "5"})


def _call(tracer, rollout: str, t: int, messages, prompt, answer, text="", tool_calls=()) -> None:
    choice = ChoiceOutput(
        text=text,
        tool_calls=list(tool_calls),
        token_ids=answer,
        logprobs=[-0.5] * len(answer),
        finish_reason="tool_calls" if tool_calls else "stop",
    )
    _record(tracer, rollout, t, messages, CallOutput(prompt_token_ids=prompt, choices=[choice]))


def _record(tracer, rollout: str, t: int, messages, output: CallOutput | None, error: str | None = None):
    """One call's span as the gateway records it."""
    identity = {names.ROLLOUT_ID: rollout, names.GROUP_ID: "g", names.TASK_ID: "sum"}
    request = {"model": "tiny", "messages": messages}
    record_call(
        tracer,
        CallRecord(
            operation="chat",
            request=request,
            sent=request,
            identity=identity,
            parent=None,
            policy_version=3,
            start_ns=t,
            end_ns=t + 1000,
            output=output,
            error_type=error,
        ),
    )


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """r1 (two turns, reward 1), r2 (reward 0), r3 (timed out), r4 (only a self-reported reward), group g."""
    path = tmp_path_factory.mktemp("export") / "store.duckdb"
    with Store(path) as store:
        provider = gateway_tracer_provider(partial(ingest_traces, store), flush_ms=10)
        gateway, controller = (
            provider.get_tracer(names.GATEWAY_SCOPE),
            provider.get_tracer(names.CONTROLLER_SCOPE),
        )
        t = time.time_ns()
        tool = ToolCallOutput("c1", "calc", '{"expression": "2+3"}')
        _call(gateway, "r1", t, QUESTION, [1, 2, 3], [10, 11], tool_calls=[tool])
        _call(gateway, "r1", t + 10_000, AFTER_TOOL, [1, 2, 3, 10, 11, 20, 21], [12], text="It is 5.")
        for rollout in ("r2", "r3", "r4"):
            _call(gateway, rollout, t, QUESTION, [1, 2, 3], [13], text="6")
        for rollout, status in (("r1", "ok"), ("r2", "ok"), ("r3", "timeout"), ("r4", "ok")):
            span = controller.start_span(
                names.ROLLOUT_SPAN_NAME,
                attributes={names.ROLLOUT_ID: rollout, names.GROUP_ID: "g", names.ROLLOUT_STATUS: status},
            )
            span.set_status(Status(StatusCode.OK))
            span.end()
        provider.force_flush()
        provider.shutdown()
        for rollout, value, source in (("r1", 1.0, "grader"), ("r2", 0.0, "grader"), ("r3", 0.0, "grader")):
            ingest_logs(
                store, reward_log_request(RewardIn(rollout_id=rollout, value=value, source=source), now_ns=t)
            )
        ingest_logs(
            store, reward_log_request(RewardIn(rollout_id="r4", value=1.0, source="harness"), now_ns=t)
        )
    return path


def test_export_samples_writes_the_scored_rollouts_and_reports_what_it_left_out(
    store_path: Path, tmp_path: Path
):
    out = tmp_path / "samples.parquet"
    result = CliRunner().invoke(app, ["export", "samples", "--db", str(store_path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    samples = pl.read_parquet(out).sort("rollout_id")
    assert samples["rollout_id"].to_list() == ["r1", "r2"]
    r1, r2 = samples.to_dicts()
    assert (r1["prompt_ids"], r1["response_ids"], r1["response_mask"]) == (
        [1, 2, 3],
        [10, 11, 20, 21, 12],
        [1, 1, 0, 0, 1],
    )
    assert r1["rollout_logprobs"] == [-0.5, -0.5, 0.0, 0.0, -0.5]
    assert (r1["token_source"], r1["policy_version_min"], r1["group_id"]) == ("exact", 3, "g")
    # GRPO over r1 and r2 only: the timed-out r3 is not a zero in the group
    assert r1["advantage"] == pytest.approx(0.7071, abs=1e-3) and r2["advantage"] == pytest.approx(
        -0.7071, abs=1e-3
    )
    assert "status_timeout: 1" in result.output and "untrusted_reward: 1" in result.output


def test_export_sft_writes_the_conversations_of_rewarded_rollouts(store_path: Path, tmp_path: Path):
    out = tmp_path / "sft.jsonl"
    result = CliRunner().invoke(
        app, ["export", "sft", "--db", str(store_path), "--min-reward", "0.5", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    (line,) = out.read_text().splitlines()
    user, assistant, tool, answer = json.loads(line)["messages"]
    assert (user, tool, answer) == (QUESTION[0], AFTER_TOOL[2], {"role": "assistant", "content": "It is 5."})
    # OpenAI format: arguments as JSON text (the gateway's span re-serializes them compactly)
    (call,) = assistant["tool_calls"]
    assert call["function"]["name"] == "calc" and json.loads(call["function"]["arguments"]) == {
        "expression": "2+3"
    }


def test_a_bad_where_clause_is_a_clear_error(store_path: Path, tmp_path: Path):
    result = CliRunner().invoke(
        app,
        [
            "export",
            "samples",
            "--db",
            str(store_path),
            "--where",
            "no_such_column = 1",
            "-o",
            str(tmp_path / "x"),
        ],
    )
    assert result.exit_code == 1 and "no_such_column" in result.output


@pytest.fixture(scope="module")
def mixed_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Gateway calls of every shape (n = 2 with an aborted choice, a failed call, a call without ids) in m1,
    and a call recorded by a client instrumentation only (latest semconv, no ids) in m2."""
    path = tmp_path_factory.mktemp("mixed") / "store.duckdb"
    with Store(path) as store:
        provider = gateway_tracer_provider(partial(ingest_traces, store), flush_ms=10)
        gateway = provider.get_tracer(names.GATEWAY_SCOPE)
        t = time.time_ns()
        _call(gateway, "m1", t, QUESTION, [1, 2, 3], [10, 11])
        two = [
            ChoiceOutput(text="5", token_ids=[12], logprobs=[-0.25], finish_reason="stop"),
            ChoiceOutput(text="", token_ids=[13, 14], logprobs=[-1.0, -2.0], finish_reason="abort"),
        ]
        _record(gateway, "m1", t + 10, QUESTION, CallOutput(prompt_token_ids=[1, 2, 3], choices=two))
        _record(gateway, "m1", t + 20, QUESTION, None, error="APIConnectionError")
        _record(gateway, "m1", t + 30, QUESTION, CallOutput(choices=[ChoiceOutput(text="6")]))
        client = provider.get_tracer("opentelemetry.instrumentation.openai_v2")
        output = [{"role": "assistant", "parts": [{"type": "text", "content": "5"}], "finish_reason": "stop"}]
        client.start_span(
            "chat tiny",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "tiny",
                "gen_ai.output.messages": json.dumps(output),
                names.ROLLOUT_ID: "m2",
            },
        ).end()
        provider.force_flush()
        provider.shutdown()
    return path


def test_llm_calls_has_the_token_data_of_every_gateway_call(mixed_store: Path):
    calls = query(
        f"SELECT {', '.join(CALL_COLUMNS)} FROM llm_calls WHERE dialect = 'gateway'"
        " ORDER BY start_time_unix_nano",
        db=mixed_store,
    )
    assert calls["finish_reasons"].to_list() == [["stop"], ["stop", "abort"], None, None]
    assert calls["is_error"].to_list() == [False, False, True, False]
    assert calls["completion_token_ids"].to_list() == [[[10, 11]], [[12], [13, 14]], None, None]


def test_load_inputs_reads_the_calls_of_llm_calls_whatever_their_dialect(mixed_store: Path):
    calls, rollouts, _ = load_inputs("true", partial(query, db=mixed_store))
    expected = query(
        f"SELECT {', '.join(CALL_COLUMNS)} FROM llm_calls WHERE rollout_id IS NOT NULL"
        " ORDER BY rollout_id, start_time_unix_nano, span_id",
        db=mixed_store,
    )
    assert calls.equals(expected) and calls["rollout_id"].to_list() == ["m1"] * 4 + ["m2"]
    # with each rollout's hack detectors (none flagged these)
    assert rollouts.columns == [*ROLLOUT_COLUMNS, FLAGS_COLUMN]
    assert rollouts[FLAGS_COLUMN].null_count() == rollouts.height
