"""Hostile values on a real `otel-rl serve`: rollout ids and reward values held to one rule on every route
(rewards API, key issue, OTLP, the gateway's identity), `/healthz` telling strangers only that it is up, and
the headers that keep a browser from guessing types or leaking the page it was on."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from otel_rl import attributes as attr
from otel_rl.input_rules import MAX_ID_CHARS
from otel_rl.train.config import ConfigError
from otel_rl.train.tasks import read_tasks

PROTOBUF = {"Content-Type": "application/x-protobuf"}
HOSTILE_IDS = {
    "20,000 characters": "r" * 20_000,
    "a NUL": "r-\x00-nul",
    "a newline": "r-\n-newline",
    "a bidirectional override": "r-\u202e-evil",
}


def issue_key(server, rollout_id: str, **identity: str) -> httpx.Response:  # noqa: ANN001
    url = f"{server.http_url}/v1/admin/rollouts/{quote(rollout_id, safe='')}/key"
    return httpx.post(url, json=identity or None, headers=server.auth, timeout=30)


def stored(server, where: str) -> int:  # noqa: ANN001
    return server.scalar(f"SELECT count(*) FROM logs WHERE {where}")


@pytest.mark.parametrize("why", list(HOSTILE_IDS))
def test_no_rollout_key_is_issued_for_a_hostile_rollout_id(otel_rl_server, why) -> None:
    refused = issue_key(otel_rl_server, HOSTILE_IDS[why])

    assert refused.status_code == 400, refused.text
    assert "the rollout id" in refused.text
    assert "key" not in refused.json()


def test_no_rollout_key_is_issued_for_a_hostile_attempt_group_or_task(otel_rl_server) -> None:
    for field in ("attempt_id", "group_id", "task_id"):
        refused = issue_key(otel_rl_server, f"r-{uuid.uuid4().hex}", **{field: "x\n" * 3})
        assert refused.status_code == 400, refused.text
        assert "holds the unprintable character U+000A" in refused.text

    issued = issue_key(otel_rl_server, f"r-{uuid.uuid4().hex}", task_id="django__django-1234 (v2)")
    assert issued.status_code == 200 and issued.json()["key"].startswith("orl-rk-")


def test_the_rewards_api_refuses_a_5_mb_rollout_id_and_a_reward_that_is_not_a_number(otel_rl_server) -> None:
    name = f"hostile-{uuid.uuid4().hex[:8]}"
    url = f"{otel_rl_server.http_url}/v1/rewards"

    def post(body: bytes) -> httpx.Response:
        headers = {**otel_rl_server.auth, "Content-Type": "application/json"}
        return httpx.post(url, content=body, headers=headers, timeout=60)

    huge = post(
        b'{"rollout_id": "' + b"r" * 5_000_000 + b'", "value": 1.0, "name": "' + name.encode() + b'"}'
    )
    boolean = post(f'{{"rollout_id": "r-ok", "value": true, "name": "{name}"}}'.encode())
    text = post(f'{{"rollout_id": "r-ok", "value": "1", "name": "{name}"}}'.encode())
    control = post(f'{{"rollout_id": "r-\\u0000", "value": 1, "name": "{name}"}}'.encode())
    number = post(f'{{"rollout_id": "r-ok", "value": 1, "name": "{name}"}}'.encode())

    assert huge.status_code == 422 and f"over the limit of {MAX_ID_CHARS}" in huge.text
    assert len(huge.content) < 2000  # the refusal does not echo what it refused
    assert boolean.status_code == 422 and boolean.json()["detail"][0]["loc"] == ["body", "value"]
    assert text.status_code == 422 and text.json()["detail"][0]["loc"] == ["body", "value"]
    assert control.status_code == 422 and "U+0000" in control.text
    assert number.status_code == 200 and number.json()["value"] == 1.0
    deadline = time.monotonic() + 20
    name_is = f"attributes->>'{attr.EVALUATION_NAME}' = '{name}'"
    while stored(otel_rl_server, name_is) < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stored(otel_rl_server, name_is) == 1  # the number only


def test_an_otlp_record_with_a_hostile_identity_is_refused_with_its_reason(otel_rl_server) -> None:
    rollout_id = f"r-{uuid.uuid4().hex}"
    key = issue_key(otel_rl_server, rollout_id).json()["key"]
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    for name, identity in (
        ("fine", {attr.ROLLOUT_ID: rollout_id}),
        ("long task", {attr.ROLLOUT_ID: rollout_id, attr.TASK_ID: "t" * 20_000}),
        ("nul group", {attr.ROLLOUT_ID: rollout_id, attr.GROUP_ID: "g\x00"}),
    ):
        span = spans.add(trace_id=os.urandom(16), span_id=os.urandom(8), name=name)
        for k, v in identity.items():
            span.attributes.add(key=k).value.string_value = v
    # The admin token's export: its resource names a rollout with a newline.
    admin_request = ExportTraceServiceRequest()
    resource_spans = admin_request.resource_spans.add()
    resource_spans.resource.attributes.add(key=attr.ROLLOUT_ID).value.string_value = "r-\nadmin"
    resource_spans.scope_spans.add().spans.add(trace_id=os.urandom(16), span_id=os.urandom(8), name="admin")

    def export(body: ExportTraceServiceRequest, token: str) -> ExportTraceServiceResponse:
        headers = {**PROTOBUF, "Authorization": f"Bearer {token}"}
        response = httpx.post(
            f"{otel_rl_server.http_url}/v1/traces",
            content=body.SerializeToString(),
            headers=headers,
            timeout=30,
        )
        assert response.status_code == 200, response.text
        return ExportTraceServiceResponse.FromString(response.content)

    by_key = export(request, key).partial_success
    by_admin = export(admin_request, otel_rl_server.token).partial_success

    assert by_key.rejected_spans == 2
    assert "otel_rl.task.id 'tttt" in by_key.error_message and "over the limit of 256" in by_key.error_message
    assert "otel_rl.group.id 'g\\x00' holds the unprintable character U+0000" in by_key.error_message
    assert len(by_key.error_message) < 1000
    assert (
        by_admin.rejected_spans == 1 and "resource: otel_rl.rollout.id 'r-\\nadmin'" in by_admin.error_message
    )


def test_an_otlp_reward_that_is_a_boolean_or_text_is_refused(otel_rl_server) -> None:
    request = ExportLogsServiceRequest()
    records = request.resource_logs.add().scope_logs.add().log_records
    for label, kind, value in (
        ("bool", "bool_value", True),
        ("word", "string_value", "yes"),
        ("ok", "int_value", 1),
    ):
        record = records.add(event_name=attr.EVALUATION_EVENT, time_unix_nano=time.time_ns())
        record.attributes.add(key=attr.EVALUATION_NAME).value.string_value = label
        setattr(record.attributes.add(key=attr.EVALUATION_SCORE_VALUE).value, kind, value)
    headers = {**PROTOBUF, **otel_rl_server.auth}

    response = httpx.post(
        f"{otel_rl_server.http_url}/v1/logs", content=request.SerializeToString(), headers=headers, timeout=30
    )

    reply = ExportLogsServiceResponse.FromString(response.content).partial_success
    assert reply.rejected_log_records == 2
    assert "gen_ai.evaluation.score.value must be a finite number" in reply.error_message


def test_the_gateway_refuses_a_hostile_rollout_id_in_baggage(otel_rl_server) -> None:
    headers = {**otel_rl_server.auth, "baggage": f"{attr.ROLLOUT_ID}=r-%0A-injected"}
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}

    refused = httpx.post(
        f"{otel_rl_server.http_url}/v1/chat/completions", json=body, headers=headers, timeout=30
    )

    assert refused.status_code == 400, refused.text
    assert "otel_rl.rollout.id holds the unprintable character U+000A" in refused.text


def test_a_task_file_with_a_hostile_id_is_refused_naming_its_line(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "fine"}\n{"id": "bad\\nid"}\n')

    with pytest.raises(
        ConfigError, match=r"tasks.jsonl:2: the task's \"id\" holds the unprintable character"
    ):
        read_tasks(tasks)


def test_healthz_tells_strangers_only_that_the_server_is_up(otel_rl_server) -> None:
    url = f"{otel_rl_server.http_url}/healthz"
    key = issue_key(otel_rl_server, f"r-{uuid.uuid4().hex}").json()["key"]

    anonymous = httpx.get(url, timeout=10)
    rollout = httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=10)
    wrong = httpx.get(url, headers={"Authorization": "Bearer not-the-token"}, timeout=10)
    admin = httpx.get(url, headers=otel_rl_server.auth, timeout=10)

    for answer in (anonymous, rollout, wrong):
        assert answer.status_code == 200 and answer.json() == {"status": "ok"}
        assert str(otel_rl_server.db) not in answer.text
    assert admin.status_code == 200 and admin.json()["db"] == str(otel_rl_server.db)
    assert {"views", "writes", "normalized"} <= admin.json().keys()


@pytest.mark.parametrize(
    "path", ["/ui/", "/ui/assets/app.js", "/ui/api/rollouts", "/ui/api/nothing", "/healthz"]
)
def test_every_answer_says_nosniff_and_no_referrer(otel_rl_server, path) -> None:
    answer = httpx.get(f"{otel_rl_server.http_url}{path}", headers=otel_rl_server.auth, timeout=30)

    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["referrer-policy"] == "no-referrer"
