"""A rollout key adds data to its own rollout only; reward source by credential; latest by arrival."""

import json
import os
import time

import grpc
import httpx
import polars as pl
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue

from otel_rl import attributes as attr
from otel_rl.transforms.rewards import RewardSpec, outcome_rewards

TRANSPORTS = ("protobuf", "json", "grpc")
SIGNALS = {
    "traces": (ExportTraceServiceResponse, "opentelemetry.proto.collector.trace.v1.TraceService"),
    "logs": (ExportLogsServiceResponse, "opentelemetry.proto.collector.logs.v1.LogsService"),
    "metrics": (ExportMetricsServiceResponse, "opentelemetry.proto.collector.metrics.v1.MetricsService"),
}
REJECTED = {"traces": "rejected_spans", "logs": "rejected_log_records", "metrics": "rejected_data_points"}


def kv(key: str, value: object) -> KeyValue:
    if isinstance(value, AnyValue):
        return KeyValue(key=key, value=value)
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def new_ids() -> tuple[bytes, bytes]:
    return os.urandom(16), os.urandom(8)


def spans(*specs: dict, resource: list[KeyValue] = ()) -> ExportTraceServiceRequest:
    """One span per spec: trace, span, parent, name, attributes, events [(name, attrs, t)], links, start."""
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.extend(resource)
    scope = rs.scope_spans.add()
    for spec in specs:
        start = spec.get("start", time.time_ns())
        span = scope.spans.add(
            trace_id=spec["trace"], span_id=spec["span"], parent_span_id=spec.get("parent", b""),
            name=spec.get("name", "work"), start_time_unix_nano=start, end_time_unix_nano=start + 1000,
        )  # fmt: skip
        span.attributes.extend(spec.get("attributes", []))
        for name, attributes, at in spec.get("events", []):
            span.events.add(name=name, time_unix_nano=at).attributes.extend(attributes)
        for attributes in spec.get("links", []):
            span.links.add(trace_id=os.urandom(16), span_id=os.urandom(8)).attributes.extend(attributes)
    return request


def call_attributes(model: str) -> list[KeyValue]:
    return [kv("gen_ai.operation.name", "chat"), kv("gen_ai.request.model", model)]


def reward_logs(*records: dict, resource: list[KeyValue] = ()) -> ExportLogsServiceRequest:
    """One gen_ai.evaluation.result log record per spec: attributes, trace, span, time."""
    request = ExportLogsServiceRequest()
    rl = request.resource_logs.add()
    rl.resource.attributes.extend(resource)
    scope = rl.scope_logs.add()
    for spec in records:
        record = scope.log_records.add(
            event_name=spec.get("event_name", attr.EVALUATION_EVENT),
            time_unix_nano=spec.get("time", time.time_ns()),
            trace_id=spec.get("trace", b""),
            span_id=spec.get("span", b""),
        )
        record.attributes.extend(spec["attributes"])
    return request


def reward_attributes(value: float | str, *, source: str | None = None, **identity: str) -> list[KeyValue]:
    out = [kv(attr.EVALUATION_NAME, "outcome"), kv(attr.EVALUATION_SCORE_VALUE, value)]
    if source is not None:
        out.append(kv(attr.REWARD_SOURCE, source))
    return out + [kv(key, text) for key, text in identity.items()]


def gauge(point_attributes: list[KeyValue]) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    metric = request.resource_metrics.add().scope_metrics.add().metrics.add(name="isolation.gauge")
    metric.gauge.data_points.add(time_unix_nano=time.time_ns(), as_double=1.0).attributes.extend(
        point_attributes
    )
    return request


def export(server, signal: str, request, token: str, transport: str):
    """Send an export over OTLP/HTTP (protobuf or JSON) or OTLP/gRPC; returns its response message."""
    response_type, service = SIGNALS[signal]
    if transport == "grpc":
        with grpc.insecure_channel(server.grpc_target) as channel:
            call = channel.unary_unary(
                f"/{service}/Export",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=response_type.FromString,
            )
            return call(request, metadata=[("authorization", f"Bearer {token}")], timeout=30)
    headers = {"Authorization": f"Bearer {token}"}
    if transport == "json":
        body = json_format.MessageToJson(request).encode()
        headers["Content-Type"] = "application/json"
    else:
        body = request.SerializeToString()
        headers["Content-Type"] = "application/x-protobuf"
    reply = httpx.post(f"{server.http_url}/v1/{signal}", content=body, headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text
    if transport == "json":
        return json_format.Parse(reply.content, response_type())
    return response_type.FromString(reply.content)


def rollout_key(server, rollout_id: str, **identity: str) -> str:
    """A key issued for `rollout_id`, with the rest of its identity (attempt_id, group_id, ...)."""
    url = f"{server.http_url}/v1/admin/rollouts/{rollout_id}/key"
    reply = httpx.post(url, json=identity, headers=server.auth, timeout=10)
    assert reply.status_code == 200, reply.text
    return reply.json()["key"]


def post_reward(server, body: bytes | dict) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {**server.auth, "Content-Type": "application/json"}
    return httpx.post(f"{server.http_url}/v1/rewards", content=content, headers=headers, timeout=10)


def rows(server, sql: str) -> list[dict]:
    return server.sql(sql).to_pylist()


def victim_rows(server, rollout_id: str) -> dict[str, list[dict]]:
    """What a user sees of a rollout: its llm_calls, rewards and rollouts rows."""
    where = f"WHERE rollout_id = '{rollout_id}'"
    return {
        "llm_calls": rows(
            server, f"SELECT span_id, request_model AS model, group_id FROM llm_calls {where} ORDER BY 1"
        ),
        "rewards": rows(server, f"SELECT span_id, level, value, source FROM rewards {where} ORDER BY 1, 3"),
        "rollouts": rows(
            server, f"SELECT attempt_id, group_id, n_calls, outcome_reward FROM rollouts {where}"
        ),
    }


@pytest.fixture
def victim(otel_rl_server) -> dict:
    """Another rollout, sent with the admin token: a rollout span, one model call, a grader's reward."""
    rollout_id = "victim-" + os.urandom(6).hex()
    trace, root = new_ids()
    call = os.urandom(8)
    identity = [kv(attr.ROLLOUT_ID, rollout_id), kv(attr.GROUP_ID, "victim-group")]
    request = spans(
        {"trace": trace, "span": root, "name": "rollout", "attributes": identity},
        {
            "trace": trace,
            "span": call,
            "parent": root,
            "attributes": identity + call_attributes("victim-model"),
        },
    )
    export(otel_rl_server, "traces", request, otel_rl_server.token, "protobuf")
    assert post_reward(otel_rl_server, {"rollout_id": rollout_id, "value": 1.0}).status_code == 200
    before = victim_rows(otel_rl_server, rollout_id)
    assert before["llm_calls"] and before["rewards"] and before["rollouts"][0]["outcome_reward"] == 1.0
    return {"rollout_id": rollout_id, "trace": trace, "root": root, "call": call, "before": before}


def escapes(victim: dict, own: str) -> dict[str, tuple[str, object, str]]:
    """Each way a record could name or be placed into the victim's rollout: (signal, request, reason)."""
    other = victim["rollout_id"]
    trace, span = new_ids()
    ev = attr.EVALUATION_EVENT
    return {
        "duplicated id": (
            "traces",
            spans(
                {
                    "trace": trace,
                    "span": span,
                    "attributes": [kv(attr.ROLLOUT_ID, own), kv(attr.ROLLOUT_ID, other)],
                }
            ),
            f"span: otel_rl.rollout.id '{other}' is another rollout than this key's ('{own}')",
        ),
        "non-string id": (
            "traces",
            spans({"trace": trace, "span": span, "attributes": [kv(attr.ROLLOUT_ID, 7)]}),
            "span: otel_rl.rollout.id must be a string, not int_value",
        ),
        "array id": (
            "traces",
            spans(
                {
                    "trace": trace,
                    "span": span,
                    "attributes": [
                        kv(
                            attr.ROLLOUT_ID,
                            AnyValue(array_value=ArrayValue(values=[AnyValue(string_value=other)])),
                        )
                    ],
                }
            ),
            "span: otel_rl.rollout.id must be a string, not array_value",
        ),
        "duplicated group": (
            "traces",
            spans(
                {"trace": trace, "span": span, "attributes": [kv(attr.GROUP_ID, "a"), kv(attr.GROUP_ID, "b")]}
            ),
            "span: otel_rl.group.id is given twice, with different values",
        ),
        "resource id": (
            "traces",
            spans(
                {"trace": trace, "span": span},
                resource=[kv(attr.ROLLOUT_ID, own), kv(attr.ROLLOUT_ID, other)],
            ),
            f"resource: otel_rl.rollout.id '{other}' is another rollout",
        ),
        "reward event naming another rollout": (
            "traces",
            spans(
                {
                    "trace": trace,
                    "span": span,
                    "events": [(ev, reward_attributes(0.0, **{attr.ROLLOUT_ID: other}), 1)],
                }
            ),
            f"span event '{ev}': otel_rl.rollout.id '{other}' is another rollout",
        ),
        "link naming another rollout": (
            "traces",
            spans({"trace": trace, "span": span, "links": [[kv(attr.ROLLOUT_ID, other)]]}),
            f"span link: otel_rl.rollout.id '{other}' is another rollout",
        ),
        "reward log naming another rollout": (
            "logs",
            reward_logs({"attributes": reward_attributes(0.0, **{attr.ROLLOUT_ID: other})}),
            f"log record: otel_rl.rollout.id '{other}' is another rollout",
        ),
        "data point naming another rollout": (
            "metrics",
            gauge([kv(attr.ROLLOUT_ID, other)]),
            f"data point: otel_rl.rollout.id '{other}' is another rollout",
        ),
    }


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_rollout_key_cannot_name_another_rollout_anywhere(otel_rl_server, victim, transport) -> None:
    own = "attacker-" + os.urandom(6).hex()
    key = rollout_key(otel_rl_server, own)

    for case, (signal, request, reason) in escapes(victim, own).items():
        response = export(otel_rl_server, signal, request, key, transport)
        partial = response.partial_success
        assert getattr(partial, REJECTED[signal]) == 1, case
        assert reason in partial.error_message, (case, partial.error_message)

    assert victim_rows(otel_rl_server, victim["rollout_id"]) == victim["before"]
    assert otel_rl_server.scalar(f"SELECT count(*) FROM spans WHERE rollout_id = '{own}'") == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_rollout_keys_records_without_an_id_stay_in_its_rollout(otel_rl_server, victim, transport) -> None:
    """Sent into the victim's trace, as its earliest spans, or parented to the victim's call: the key's."""
    own = "attacker-" + os.urandom(6).hex()
    key = rollout_key(otel_rl_server, own)
    trace, call = victim["trace"], os.urandom(8)
    request = spans(
        {
            "trace": trace,
            "span": call,
            "parent": victim["root"],
            "start": 1,
            "attributes": call_attributes("mine"),
        },
        {
            "trace": trace,
            "span": os.urandom(8),
            "attributes": [kv(attr.GROUP_ID, "victim-group-2")],
            "start": 1,
        },
    )
    assert not export(otel_rl_server, "traces", request, key, transport).HasField("partial_success")
    # a reward parented to the victim's model call: its turn reward would train the victim's segment
    logs = reward_logs(
        {"attributes": reward_attributes(-5.0, source="grader"), "trace": trace, "span": victim["call"]}
    )
    assert not export(otel_rl_server, "logs", logs, key, transport).HasField("partial_success")

    assert victim_rows(otel_rl_server, victim["rollout_id"]) == victim["before"]
    mine = victim_rows(otel_rl_server, own)
    assert [c["model"] for c in mine["llm_calls"]] == ["mine"]
    assert mine["rewards"] == [
        {"span_id": victim["call"].hex(), "level": "outcome", "value": -5.0, "source": "harness"}
    ]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_rollout_key_cannot_place_its_rollout_in_another_group(otel_rl_server, victim, transport) -> None:
    """The identity a key was issued with binds its records: a harness cannot join another GRPO group (and
    skew that group's advantages), nor relabel its attempt or split; what it does not say, the key says."""
    own = "grouped-" + os.urandom(6).hex()
    key = rollout_key(otel_rl_server, own, group_id="own-group", attempt_id="a1", split="train")
    for key_name, value in ((attr.GROUP_ID, "victim-group"), (attr.ATTEMPT_ID, "a2"), (attr.SPLIT, "val")):
        trace, span = new_ids()
        request = spans({"trace": trace, "span": span, "attributes": [kv(key_name, value)]})
        response = export(otel_rl_server, "traces", request, key, transport)
        assert response.partial_success.rejected_spans == 1
        assert f"{key_name} '{value}' is not this key's" in response.partial_success.error_message
    trace, span = new_ids()
    request = spans({"trace": trace, "span": span, "attributes": call_attributes("mine")})
    assert not export(otel_rl_server, "traces", request, key, transport).HasField("partial_success")
    assert victim_rows(otel_rl_server, victim["rollout_id"]) == victim["before"]
    assert victim_rows(otel_rl_server, own)["llm_calls"] == [
        {"span_id": span.hex(), "model": "mine", "group_id": "own-group"}
    ]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_rollout_keys_grader_reward_is_stored_as_the_harness(otel_rl_server, transport) -> None:
    own = "graded-" + os.urandom(6).hex()
    key = rollout_key(otel_rl_server, own)
    trace, span = new_ids()
    event = (
        attr.EVALUATION_EVENT,
        reward_attributes(1.0, source="grader") + [kv(attr.REWARD_SOURCE, "grader")],
        1,
    )
    export(otel_rl_server, "traces", spans({"trace": trace, "span": span, "events": [event]}), key, transport)
    export(
        otel_rl_server,
        "logs",
        reward_logs({"attributes": reward_attributes(1.0, source="grader")}),
        key,
        transport,
    )

    sources = rows(
        otel_rl_server, f"SELECT origin, source FROM rewards WHERE rollout_id = '{own}' ORDER BY origin"
    )
    assert sources == [{"origin": "log", "source": "harness"}, {"origin": "span_event", "source": "harness"}]


def test_the_latest_reward_is_the_last_received_whatever_its_timestamp(otel_rl_server) -> None:
    rollout_id = "latest-" + os.urandom(6).hex()
    trace, span = new_ids()
    identity = {attr.ROLLOUT_ID: rollout_id}
    export(
        otel_rl_server,
        "traces",
        spans({"trace": trace, "span": span, "attributes": [kv(attr.ROLLOUT_ID, rollout_id)]}),
        otel_rl_server.token,
        "protobuf",
    )
    year_2100 = 4_102_444_800 * 10**9
    future = reward_logs(
        {"attributes": reward_attributes(0.0, source="grader", **identity), "time": year_2100}
    )
    export(otel_rl_server, "logs", future, otel_rl_server.token, "protobuf")
    assert post_reward(otel_rl_server, {"rollout_id": rollout_id, "value": 1.0}).status_code == 200

    assert (
        otel_rl_server.scalar(f"SELECT outcome_reward FROM rollouts WHERE rollout_id = '{rollout_id}'") == 1.0
    )
    rewards = pl.from_arrow(otel_rl_server.sql(f"SELECT * FROM rewards WHERE rollout_id = '{rollout_id}'"))
    assert outcome_rewards(rewards, RewardSpec())["reward"].to_list() == [1.0]
    assert rewards["time"].max().year == 2100, "the record's own time stays, for display"


@pytest.mark.parametrize(
    "body",
    [
        b'{"rollout_id": "r", "value": NaN}',
        b'{"rollout_id": "r", "value": Infinity}',
        b'{"rollout_id": "r", "value": 1e999}',
    ],
)
def test_a_non_finite_reward_is_refused_over_http(otel_rl_server, body) -> None:
    reply = post_reward(otel_rl_server, body)
    assert reply.status_code == 422
    assert "finite number" in reply.text


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_non_finite_reward_record_is_refused(otel_rl_server, transport) -> None:
    rollout_id = "nan-" + os.urandom(6).hex()
    identity = {attr.ROLLOUT_ID: rollout_id}
    records = [
        reward_attributes(v, source="grader", **identity) for v in (float("nan"), float("inf"), "-inf", 0.5)
    ]
    reply = export(
        otel_rl_server,
        "logs",
        reward_logs(*({"attributes": a} for a in records)),
        otel_rl_server.token,
        transport,
    )
    assert reply.partial_success.rejected_log_records == 3
    assert "gen_ai.evaluation.score.value must be a finite number" in reply.partial_success.error_message
    trace, span = new_ids()
    event = (attr.EVALUATION_EVENT, reward_attributes(float("-inf"), **identity), 1)
    reply = export(
        otel_rl_server,
        "traces",
        spans({"trace": trace, "span": span, "events": [event]}),
        otel_rl_server.token,
        transport,
    )
    assert reply.partial_success.rejected_spans == 1

    assert rows(otel_rl_server, f"SELECT value FROM rewards WHERE rollout_id = '{rollout_id}'") == [
        {"value": 0.5}
    ]
