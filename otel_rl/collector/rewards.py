"""POST /v1/rewards: an external grader's reward, stored as a `gen_ai.evaluation.result` log record."""

import asyncio
import re
import time

from fastapi import APIRouter, Depends, HTTPException
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import SeverityNumber
from pydantic import BaseModel, Field, field_validator

from otel_rl import attributes as attr
from otel_rl.auth import Auth, admin_required
from otel_rl.collector.ingest import logs_batch
from otel_rl.input_rules import MAX_ID_CHARS, IdValue, RewardValue
from otel_rl.store import Saturated, Store, StoreUnavailable
from otel_rl.store.layout import SENDER_ADMIN

REWARDS_SCOPE = "otel_rl.rewards_api"
MAX_EXPLANATION_CHARS = 64 * 1024  # a grader's reasons; more is not an explanation


class RewardIn(BaseModel):
    """A reward for one rollout, or for one model call of it (`span_id`)."""

    rollout_id: IdValue  # the same rule as everywhere (otel_rl/input_rules.py)
    value: RewardValue  # a JSON number: NaN, infinities, `true` and "1" are refused
    name: str = Field(default="outcome", min_length=1, max_length=MAX_ID_CHARS)
    source: str = Field(default=attr.REWARD_SOURCE_GRADER, min_length=1, max_length=MAX_ID_CHARS)
    label: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    explanation: str | None = Field(default=None, max_length=MAX_EXPLANATION_CHARS)
    trace_id: str | None = Field(default=None, description="32 hex digits: the trace of the rewarded span")
    span_id: str | None = Field(default=None, description="16 hex digits: the span rewarded (a turn reward)")

    @field_validator("trace_id")
    @classmethod
    def _trace_id_is_hex(cls, value: str | None) -> str | None:
        return _check_hex(value, 32, "trace_id")

    @field_validator("span_id")
    @classmethod
    def _span_id_is_hex(cls, value: str | None) -> str | None:
        return _check_hex(value, 16, "span_id")


def _check_hex(value: str | None, digits: int, name: str) -> str | None:
    if value is not None and not re.fullmatch(f"[0-9a-fA-F]{{{digits}}}", value):
        raise ValueError(f"{name} must be {digits} hex digits")
    return value.lower() if value else None


def reward_log_request(reward: RewardIn, *, now_ns: int) -> ExportLogsServiceRequest:
    """The OTLP log export that records a reward, as the rewards views read it."""
    request = ExportLogsServiceRequest()
    resource_logs = request.resource_logs.add()
    resource_logs.resource.attributes.append(_kv("service.name", "otel-rl"))
    scope_logs = resource_logs.scope_logs.add()
    scope_logs.scope.name = REWARDS_SCOPE
    record = scope_logs.log_records.add(
        time_unix_nano=now_ns,
        observed_time_unix_nano=now_ns,
        severity_number=SeverityNumber.SEVERITY_NUMBER_INFO,
        event_name=attr.EVALUATION_EVENT,
    )
    fields = {
        attr.ROLLOUT_ID: reward.rollout_id,
        attr.EVALUATION_NAME: reward.name,
        attr.EVALUATION_SCORE_VALUE: reward.value,
        attr.EVALUATION_SCORE_LABEL: reward.label,
        attr.EVALUATION_EXPLANATION: reward.explanation,
        attr.REWARD_SOURCE: reward.source,
    }
    record.attributes.extend(_kv(key, value) for key, value in fields.items() if value is not None)
    if reward.trace_id:
        record.trace_id = bytes.fromhex(reward.trace_id)
    if reward.span_id:
        record.span_id = bytes.fromhex(reward.span_id)
    return request


def _kv(key: str, value: str | float) -> KeyValue:
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def rewards_router(store: Store, auth: Auth) -> APIRouter:
    """POST /v1/rewards (admin token only: a rollout key must not grade its own rollout)."""
    router = APIRouter(tags=["rewards"])

    @router.post(
        "/v1/rewards",
        summary="Record a reward for a rollout (or one of its model calls)",
        dependencies=[Depends(admin_required(auth))],
    )
    async def post_reward(reward: RewardIn) -> dict:
        batch = logs_batch(store, reward_log_request(reward, now_ns=time.time_ns()), SENDER_ADMIN)
        try:
            await asyncio.wrap_future(store.submit(batch))
        except (Saturated, StoreUnavailable) as exc:
            raise HTTPException(503, str(exc), headers={"Retry-After": "1"}) from None
        return {"stored": True, "rollout_id": reward.rollout_id, "name": reward.name, "value": reward.value}

    return router
