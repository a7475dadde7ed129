"""The captured fixtures of every instrumentation library, through the real store and views, into segments."""

import json

import numpy as np
import polars as pl
import pytest
from otel_fixtures import captured_requests

from otel_rl.collector.ingest import ingest_logs, ingest_traces
from otel_rl.store import Store
from otel_rl.transforms.merge import merge_segments
from otel_rl.transforms.tokens import call_tokens, measure_drift

AGENT_TOOL_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call><|im_end|>'
AGENT_ANSWER = "It is 18°C and sunny in Paris.<|im_end|>"
AGENT_TOOL_RESULT = (
    '\n<|im_start|>tool\n{"city": "Paris", "temp_c": 18, "condition": "sunny"}<|im_end|>'
    "\n<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def fixture_calls(tmp_path_factory: pytest.TempPathFactory) -> pl.DataFrame:
    """Every captured export ingested into a store; its `llm_calls` rows, each trace standing for a rollout.

    The fixtures carry no rollout identity: a trace is one agent run. `fixture` names the file it came from.
    """
    trace_files = []
    with Store(tmp_path_factory.mktemp("fixtures") / "store.duckdb") as store:
        for request in captured_requests():
            if request.signal == "traces":
                ingest_traces(store, request.decoded)
                trace_files += [
                    (span.trace_id.hex(), request.name, span.span_id.hex(), _output_value(span))
                    for resource in request.decoded.resource_spans
                    for scope in resource.scope_spans
                    for span in scope.spans
                ]
            elif request.signal == "logs":
                ingest_logs(store, request.decoded)
        calls = pl.from_arrow(store.query_arrow("SELECT * FROM llm_calls"))
    files = pl.DataFrame(trace_files, schema=["trace_id", "fixture", "span_id", "output_value"], orient="row")
    return (
        calls.join(files, on=["trace_id", "span_id"], how="left")
        .with_columns(rollout_id=pl.coalesce("rollout_id", "trace_id"))
        .sort("rollout_id", "start_time_unix_nano")
    )


def _output_value(span) -> str | None:
    return next((a.value.string_value for a in span.attributes if a.key == "output.value"), None)


def test_every_librarys_agent_run_retokenizes_into_one_segment_with_the_tool_result_masked(
    fixture_calls, tiny_tokenizer
):
    # the agent scenario: call 1 answers with a tool call, call 2 sees the tool result and answers
    agent_runs = fixture_calls.filter(
        pl.col("fixture").str.contains("agent") & ~pl.col("fixture").str.contains("nocontent")
    )
    without_ids = agent_runs.with_columns(prompt_token_ids=None, completion_token_ids=None)
    retokenized = call_tokens(without_ids, tiny_tokenizer)
    assert retokenized["token_source"].to_list() == ["retokenized"] * agent_runs.height

    segments, _ = merge_segments(retokenized)
    assert segments.height == agent_runs["trace_id"].n_unique() >= 12  # 3 libraries, 12 captured runs
    for row in segments.iter_rows(named=True):
        assert row["n_calls"] == 2 and row["token_source"] == "retokenized"
        response, mask = np.array(row["response_ids"]), np.array(row["response_mask"], dtype=bool)
        assert tiny_tokenizer.decode(response[mask]) == AGENT_TOOL_CALL + AGENT_ANSWER
        assert tiny_tokenizer.decode(response[~mask]) == AGENT_TOOL_RESULT
        assert not row["has_logprobs"]


def test_openinference_calls_take_the_exact_ids_and_logprobs_of_the_vllm_response(fixture_calls):
    calls = call_tokens(fixture_calls.filter(~pl.col("is_error")), tokenizer=None)
    exact = calls.filter(pl.col("token_source") == "exact")
    assert set(exact["dialect"]) == {"openinference"} and exact.height == 15
    assert (
        calls.filter(pl.col("dialect") != "openinference")["token_source"].null_count() == calls.height - 15
    )
    for row in exact.iter_rows(named=True):
        response = json.loads(row["output_value"])
        assert row["prompt_ids"] == response["prompt_token_ids"]
        assert row["completion_ids"] == [choice["token_ids"] for choice in response["choices"]]
        recorded = [(choice.get("logprobs") or {}).get("content") for choice in response["choices"]]
        if recorded == [None] * len(recorded):  # vLLM sent no logprobs for the streamed tool call
            assert row["completion_logprobs"] is None
            continue
        for logprobs, entries in zip(row["completion_logprobs"], recorded, strict=True):
            assert logprobs == pytest.approx([entry["logprob"] for entry in entries])

    segments, _ = merge_segments(exact)
    assert set(segments["token_source"]) == {"exact"}
    assert segments["has_logprobs"].sum() == segments.height - 3  # the three streamed tool calls
    n2 = segments.join(exact.select("rollout_id", "fixture").unique(), on="rollout_id").filter(
        pl.col("fixture").str.contains("n2")
    )
    # n = 2: each choice is its own sibling segment, with the same prompt
    assert n2.group_by("rollout_id").agg(pl.len(), pl.col("prompt_ids").n_unique())["len"].to_list() == [
        2,
        2,
        2,
    ]
    # the fake server's prompt ids leave out its earlier answers: the agent's second call breaks the prefix
    agent = segments.join(exact.select("rollout_id", "fixture").unique(), on="rollout_id").filter(
        pl.col("fixture").str.contains("agent")
    )
    assert agent["n_calls"].to_list() == [1] * 6


def test_drift_between_the_fake_servers_ids_and_the_tiny_tokenizer_is_total(fixture_calls, tiny_tokenizer):
    drift = measure_drift(fixture_calls.filter(~pl.col("is_error")), tiny_tokenizer, limit=100)
    # only OpenInference records ids next to the messages; the fake vLLM's ids are not the tiny tokenizer's
    assert (drift.compared, drift.differing, drift.share) == (15, 15, 1.0)
    assert drift.first_diff_positions == [0] * 15
