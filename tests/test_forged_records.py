"""Only the server writes what the server vouches for: a harness holding its own rollout key sends, over
OTLP/HTTP protobuf to a real `otel-rl serve`, the records of the server's components — a gateway call with
exact token ids, the controller's status, a trainer step, a grader's reward — and none of them reaches a
sample, a status, the training pages or the trusted reward; each is kept as the harness's claim."""

import os
import struct
import time
import uuid
from pathlib import Path

import httpx
import polars as pl
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from test_rollout_isolation import export, kv, post_reward, reward_attributes, reward_logs, rollout_key
from typer.testing import CliRunner

from otel_rl import attributes as attr
from otel_rl.cli import app
from otel_rl.store import reads, ui_reads
from otel_rl.transforms.rewards import DEFAULT_TRUSTED_SOURCES

TEN_YEARS_NS = 10 * 365 * 86400 * 10**9


def packed(values: list, kind: str) -> KeyValue:
    return AnyValue(bytes_value=struct.pack(f"<{len(values)}{kind}", *values))


def one_span(scope: str, name: str, attributes: list[KeyValue], start: int) -> ExportTraceServiceRequest:
    """One span of `scope`, as that component's SDK exports it."""
    request = ExportTraceServiceRequest()
    scope_spans = request.resource_spans.add().scope_spans.add()
    scope_spans.scope.name = scope
    span = scope_spans.spans.add(
        trace_id=os.urandom(16), span_id=os.urandom(8), name=name, kind=3,
        start_time_unix_nano=start, end_time_unix_nano=start + 10**6,
    )  # fmt: skip
    span.attributes.extend(attributes)
    return request


def gateway_call(rollout_id: str, group_id: str) -> ExportTraceServiceRequest:
    """A call span in the gateway's scope with packed token ids and logprobs, as the gateway writes it."""
    attributes = [
        kv("gen_ai.operation.name", "chat"),
        kv("gen_ai.request.model", "policy"),
        kv(attr.ROLLOUT_ID, rollout_id),
        kv(attr.GROUP_ID, group_id),
        kv(attr.POLICY_VERSION, 3),
        kv(attr.PROMPT_TOKEN_IDS, packed([1, 2, 3], "i")),
        kv(attr.CHOICE_TOKEN_IDS.format(i=0), packed([7, 8], "i")),
        kv(attr.CHOICE_LOGPROBS.format(i=0), packed([-0.5, -0.25], "f")),
    ]
    return one_span(attr.GATEWAY_SCOPE, "chat policy", attributes, time.time_ns())


def wait_for(server, sql: str, expected: object, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while server.scalar(sql) != expected:
        assert time.monotonic() < deadline, f"{sql} never gave {expected!r}"
        time.sleep(0.1)


def test_a_forged_gateway_call_never_becomes_exact_tokens_or_a_sample(otel_rl_server, tmp_path: Path) -> None:
    group = "forged-gw-" + uuid.uuid4().hex[:8]
    genuine = [f"{group}-genuine-{i}" for i in range(2)]
    forged = f"{group}-forged"
    for rollout_id in genuine:  # what the server's side vouches for (sent here with the admin token)
        export(otel_rl_server, "traces", gateway_call(rollout_id, group), otel_rl_server.token, "protobuf")
    key = rollout_key(otel_rl_server, forged, group_id=group)
    export(otel_rl_server, "traces", gateway_call(forged, group), key, "protobuf")
    for rollout_id, value in zip([*genuine, forged], [1.0, 0.0, 1.0], strict=True):
        assert post_reward(otel_rl_server, {"rollout_id": rollout_id, "value": value}).status_code == 200
    wait_for(otel_rl_server, f"SELECT count(*) FROM llm_calls WHERE group_id = '{group}'", 3)

    (claim,) = otel_rl_server.sql(
        "SELECT dialect, sender, prompt_token_ids, completion_token_ids, completion_logprobs, policy_version"
        f" FROM llm_calls WHERE rollout_id = '{forged}'"
    ).to_pylist()
    # kept, as the harness's claim: its semconv call, no exact ids, no policy version
    assert claim == {
        "dialect": "semconv", "sender": "rollout", "prompt_token_ids": None, "completion_token_ids": None,
        "completion_logprobs": None, "policy_version": None,
    }  # fmt: skip
    exact = otel_rl_server.sql(
        "SELECT rollout_id, dialect, sender, prompt_token_ids FROM llm_calls"
        f" WHERE group_id = '{group}' AND rollout_id <> '{forged}' ORDER BY 1"
    ).to_pylist()
    assert exact == [
        {"rollout_id": r, "dialect": "gateway", "sender": "admin", "prompt_token_ids": [1, 2, 3]}
        for r in genuine
    ]

    # the token inspector shows the genuine calls' tokens as exact, and none of the forgery's
    inspected = {
        rollout_id: httpx.get(
            f"{otel_rl_server.http_url}/ui/api/rollouts/{rollout_id}/samples",
            headers=otel_rl_server.auth,
            timeout=60,
        ).json()
        for rollout_id in (genuine[0], forged)
    }
    assert [segment["token_source"] for segment in inspected[genuine[0]]["segments"]] == ["exact"]
    assert inspected[forged]["segments"] == []

    out = tmp_path / "samples.parquet"
    args = ["export", "samples", "--server", otel_rl_server.http_url, "--token", otel_rl_server.token]
    result = CliRunner().invoke(app, [*args, "--where", f"group_id = '{group}'", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert set(pl.read_parquet(out)["rollout_id"]) == set(genuine)


def test_a_forged_controller_status_dated_ahead_never_is_the_status(otel_rl_server) -> None:
    rollout_id = "forged-status-" + uuid.uuid4().hex[:8]
    group, attempt = rollout_id + "-g", rollout_id + "-a1"
    identity = [kv(attr.ROLLOUT_ID, rollout_id), kv(attr.GROUP_ID, group), kv(attr.ATTEMPT_ID, attempt)]
    key = rollout_key(otel_rl_server, rollout_id, group_id=group, attempt_id=attempt)
    ok = [kv(attr.ROLLOUT_STATUS, "ok"), kv(attr.ROLLOUT_EXIT_CODE, 0)]
    ahead = time.time_ns() + TEN_YEARS_NS
    forged = one_span(attr.CONTROLLER_SCOPE, attr.ROLLOUT_SPAN_NAME, identity + ok, ahead)
    export(otel_rl_server, "traces", forged, key, "protobuf")
    progress = reads.attempt_progress(otel_rl_server.run, [attempt], time.time_ns() - 60 * 10**9).to_dicts()
    assert progress == [], "a harness cannot say its attempt finished"

    timeout = [kv(attr.ROLLOUT_STATUS, "timeout"), kv(attr.ROLLOUT_EXIT_CODE, -9)]
    real = one_span(attr.CONTROLLER_SCOPE, attr.ROLLOUT_SPAN_NAME, identity + timeout, time.time_ns())
    export(otel_rl_server, "traces", real, otel_rl_server.token, "protobuf")

    (rollout,) = otel_rl_server.sql(
        f"SELECT status, exit_code FROM rollouts WHERE rollout_id = '{rollout_id}'"
    ).to_pylist()
    assert rollout == {"status": "timeout", "exit_code": -9}
    (final,) = reads.final_attempts(otel_rl_server.run, [group]).to_dicts()
    assert (final["final_attempt"], final["status"]) == (attempt, "timeout")
    senders = otel_rl_server.sql(
        f"SELECT sender FROM spans WHERE scope_name = '{attr.CONTROLLER_SCOPE}'"
        f" AND attributes ->> '{attr.ROLLOUT_ID}' = '{rollout_id}' ORDER BY sender"
    )["sender"].to_pylist()
    assert senders == ["admin", "rollout"], "the forgery is kept, as the harness's claim"


def test_a_forged_trainer_step_never_shows_as_a_step(otel_rl_server) -> None:
    run_id = "forged-run-" + uuid.uuid4().hex[:8]
    key = rollout_key(otel_rl_server, run_id + "-rollout")
    figures = [kv(attr.TRAIN_RUN_ID, run_id), kv(attr.TRAIN_PREFIX + "step", 1), kv(attr.POLICY_VERSION, 2)]
    step = one_span(attr.TRAIN_SCOPE, attr.TRAIN_STEP_SPAN_NAME, figures, time.time_ns())
    export(otel_rl_server, "traces", step, key, "protobuf")
    stored = f"SELECT count(*) FROM spans WHERE attributes ->> '{attr.TRAIN_RUN_ID}' = '{run_id}'"
    assert otel_rl_server.scalar(stored) == 1

    runs = ui_reads.training_runs(otel_rl_server.run)["run_id"].to_list()
    assert run_id not in runs
    assert ui_reads.training_steps(otel_rl_server.run, run_id).height == 0


def test_a_forged_grader_reward_never_is_the_trusted_reward(otel_rl_server) -> None:
    rollout_id = "forged-reward-" + uuid.uuid4().hex[:8]
    key = rollout_key(otel_rl_server, rollout_id)
    work = one_span("harness", "work", [], time.time_ns())  # the harness's own span: the rollout's row
    export(otel_rl_server, "traces", work, key, "protobuf")
    assert post_reward(otel_rl_server, {"rollout_id": rollout_id, "value": 0.0}).status_code == 200
    # afterwards, and dated ahead: "latest" would be the harness's whichever order counted
    forged = reward_logs(
        {
            "attributes": reward_attributes(
                1.0, source=attr.REWARD_SOURCE_GRADER, **{attr.ROLLOUT_ID: rollout_id}
            ),
            "time": time.time_ns() + TEN_YEARS_NS,
        }
    )
    export(otel_rl_server, "logs", forged, key, "protobuf")

    (rollout,) = otel_rl_server.sql(
        "SELECT outcome_reward, outcome_rewards_by_source AS by_source,"
        " outcome_rewards_by_source['harness'] AS harness"
        f" FROM rollouts WHERE rollout_id = '{rollout_id}'"
    ).to_pylist()
    # the grader's, which training uses; the harness's self-report beside it
    assert rollout == {
        "outcome_reward": 0.0,
        "by_source": [("grader", 0.0), ("harness", 1.0)],
        "harness": 1.0,
    }


def test_the_views_trust_the_reward_sources_training_trusts_by_default(otel_rl_server) -> None:
    trusted = {source: True for source in DEFAULT_TRUSTED_SOURCES}
    others = {attr.REWARD_SOURCE_HARNESS: False, "": False}
    for source, expected in (trusted | others).items():
        assert otel_rl_server.scalar(f"SELECT trusted_reward_source('{source}')") is expected, source
    assert otel_rl_server.scalar("SELECT trusted_reward_source(NULL)") is False
