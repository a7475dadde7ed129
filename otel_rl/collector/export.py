"""One OTLP export, whatever the transport: scope it to the caller's rollout, flatten, and build the reply."""

import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, MutableSequence
from dataclasses import dataclass

from google.protobuf.message import Message
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_rl.attributes import (
    EVALUATION_EVENT,
    EVALUATION_SCORE_VALUE,
    IDENTITY_KEYS,
    REWARD_SOURCE,
    REWARD_SOURCE_HARNESS,
    ROLLOUT_ID,
)
from otel_rl.auth import Principal
from otel_rl.collector.decode import RESPONSE_TYPES, DecodeError, ExportRequest, ExportResponse, Signal
from otel_rl.collector.ingest import logs_batch, metrics_batch, traces_batch
from otel_rl.input_rules import id_problem
from otel_rl.store import Store
from otel_rl.store.identity import rollout_key_identity
from otel_rl.store.layout import SENDER_ADMIN, SENDER_ROLLOUT, Sender
from otel_rl.store.writer import Batch

# The partial_success field that counts each signal's rejected records.
_REJECTED_FIELD: dict[Signal, str] = {
    "traces": "rejected_spans",
    "logs": "rejected_log_records",
    "metrics": "rejected_data_points",
}
_IDENTITY = frozenset(IDENTITY_KEYS)
# A refusal's reason quotes what the sender wrote: bounded, so that the reply stays small whatever it sent.
_QUOTED_CHARS = 64
_REASONS_SHOWN = 5


@dataclass(frozen=True)
class PreparedExport:
    """The rows to write for an export, the response to send once they are committed, and the records
    refused (how many for each reason)."""

    batch: Batch
    response: ExportResponse
    refused: Counter[str]


def prepare_export(
    store: Store, signal: Signal, request: ExportRequest, principal: Principal
) -> PreparedExport:
    """Rows and response of an export, without the records the caller may not send (see `refuse_records`);
    every row names the credential that sent it (`sender`), whatever the records say."""
    refused = refuse_records(signal, request, principal)
    try:
        batch = _flatten(store, signal, request, principal)
    except ValueError as exc:  # e.g. a packed token attribute whose length is not a multiple of 4
        raise DecodeError(f"{signal} request has invalid content: {exc}") from None
    response = RESPONSE_TYPES[signal]()
    if refused:
        partial = response.partial_success
        total = sum(refused.values())
        setattr(partial, _REJECTED_FIELD[signal], total)
        reasons = "; ".join(f"{n} × {reason}" for reason, n in refused.most_common(_REASONS_SHOWN))
        unshown = len(refused) - _REASONS_SHOWN
        more = f"; and {unshown} other reason(s)" if unshown > 0 else ""
        partial.error_message = f"{total} record(s) rejected: {reasons}{more}"
    return PreparedExport(batch=batch, response=response, refused=refused)


def sender_of(principal: Principal) -> Sender:
    """Who vouches for what `principal` sends: the admin token's holder, or a harness (its claims)."""
    return SENDER_ADMIN if principal.admin else SENDER_ROLLOUT


def _flatten(store: Store, signal: Signal, request: ExportRequest, principal: Principal) -> Batch:
    """The rows of `request`, each naming its sender and, for a rollout key, that key's identity (which wins
    over what a record says)."""
    sender, key = sender_of(principal), rollout_key_identity(principal.rollout_id, principal.identity)
    if signal == "traces":
        return traces_batch(request, sender, key)
    if signal == "logs":
        return logs_batch(store, request, sender, key)
    return metrics_batch(request, sender, key)


def refuse_records(signal: Signal, request: ExportRequest, principal: Principal) -> Counter[str]:
    """Remove from `request` the records `principal` may not send; returns how many for each reason.

    Anyone: a reward (`gen_ai.evaluation.result` log record or span event) whose value is NaN or infinite.
    A rollout key, which may only add data to its own rollout: any record or resource whose identity
    attributes (span, event, link, log record and data point attributes alike) are not strings, name another
    rollout, or give a key twice with different values. The records it keeps cannot be placed into another
    rollout by the views' trace inheritance, as their identity columns hold the key's (flatten.py); and
    their rewards are the harness's (`otel_rl.reward.source` rewritten), never a grader's.
    """
    refused: Counter[str] = Counter()
    # What a rollout key's records may say: its rollout id, and the rest of the identity it was issued with.
    own = None if principal.admin else {**principal.identity, ROLLOUT_ID: principal.rollout_id or ""}
    if own is None and signal == "metrics":  # the admin's data points carry no reward
        return refused
    check = _RECORD_CHECKS[signal]
    for resource, records in _record_lists(signal, request):
        # The admin's resources too (one look per resource): where a zero-code harness's identity is.
        problem = _identity_problem(resource.attributes, own)
        if problem is not None:
            refused[f"resource: {problem}"] += len(records)
            del records[:]
            continue
        # The admin's records need a look only where they hold a reward: found with no call per record.
        suspects = records if own is not None else _with_rewards(signal, records)
        problems = [(record, check(record, own)) for record in suspects]
        if any(problem is not None for _, problem in problems):
            refused.update(problem for _, problem in problems if problem is not None)
            bad = {id(record) for record, problem in problems if problem is not None}
            kept = [record for record in records if id(record) not in bad]
            del records[:]
            records.extend(kept)
    return refused


def _with_rewards(signal: Signal, records: MutableSequence) -> list:
    if signal == "traces":
        return [s for s in records if s.events and any(e.name == EVALUATION_EVENT for e in s.events)]
    return [record for record in records if record.event_name == EVALUATION_EVENT]


def _record_lists(signal: Signal, request: ExportRequest) -> Iterator[tuple[Resource, MutableSequence]]:
    """(resource, repeated records) for every scope of a request: spans, log records or data points."""
    if signal == "traces":
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                yield rs.resource, ss.spans
    elif signal == "logs":
        for rl in request.resource_logs:
            for sl in rl.scope_logs:
                yield rl.resource, sl.log_records
    else:
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    kind = metric.WhichOneof("data")
                    if kind is not None:
                        yield rm.resource, getattr(metric, kind).data_points


def _span_problem(span: Span, own: Mapping[str, str] | None) -> str | None:
    if own is not None:
        problem = _identity_problem(span.attributes, own)
        if problem is not None:
            return f"span: {problem}"
        for link in span.links:
            problem = _identity_problem(link.attributes, own)
            if problem is not None:
                return f"span link: {problem}"
    for event in span.events:
        if own is not None:
            problem = _identity_problem(event.attributes, own)
            if problem is not None:
                return f"span event {_quote(event.name)}: {problem}"
        if event.name == EVALUATION_EVENT:
            problem = _reward_problem(event.attributes, own is not None)
            if problem is not None:
                return f"span event {EVALUATION_EVENT}: {problem}"
    return None


def _log_problem(record: LogRecord, own: Mapping[str, str] | None) -> str | None:
    if own is not None:
        problem = _identity_problem(record.attributes, own)
        if problem is not None:
            return f"log record: {problem}"
    if record.event_name == EVALUATION_EVENT:
        problem = _reward_problem(record.attributes, own is not None)
        if problem is not None:
            return f"log record {EVALUATION_EVENT}: {problem}"
    return None


def _data_point_problem(point: Message, own: Mapping[str, str] | None) -> str | None:
    problem = None if own is None else _identity_problem(point.attributes, own)
    return None if problem is None else f"data point: {problem}"


_RECORD_CHECKS: dict[Signal, Callable[..., str | None]] = {
    "traces": _span_problem,
    "logs": _log_problem,
    "metrics": _data_point_problem,
}


def _identity_problem(attributes: MutableSequence, own: Mapping[str, str] | None) -> str | None:
    """Why identity attributes may not come from the key whose identity is `own` (None: the admin's, held
    to the rule of input_rules.py alone), or None when they may.

    Every occurrence is read: the check must see the value the store keeps (the last) as well as the first.
    """
    seen: dict[str, str] = {}
    for kv in attributes:
        key = kv.key
        if key not in _IDENTITY:
            continue
        value = kv.value
        if value.WhichOneof("value") != "string_value":
            return f"{key} must be a string, not {value.WhichOneof('value') or 'empty'}"
        text = value.string_value
        problem = id_problem(text)
        if problem is not None:
            return f"{key} {_quote(text)} {problem}"
        if own is None:
            continue
        expected = own.get(key)
        if key == ROLLOUT_ID and text != expected:
            return f"{key} {_quote(text)} is another rollout than this key's ({_quote(expected)})"
        if expected is not None and text != expected:  # e.g. a rollout placing itself in another group
            return f"{key} {_quote(text)} is not this key's ({_quote(expected)})"
        if seen.setdefault(key, text) != text:
            return f"{key} is given twice, with different values"
    return None


def _reward_problem(attributes: MutableSequence, from_rollout_key: bool) -> str | None:
    """Why a reward's attributes are refused (a value that is not a finite number), or None; a rollout key's
    reward then gets the source `harness`, whatever its sender wrote: the source says which credential sent
    it."""
    for kv in attributes:
        if kv.key == EVALUATION_SCORE_VALUE and not _finite(kv.value):
            return f"{EVALUATION_SCORE_VALUE} must be a finite number"
    if from_rollout_key:
        for i in reversed(range(len(attributes))):
            if attributes[i].key == REWARD_SOURCE:
                del attributes[i]
        attributes.add(key=REWARD_SOURCE).value.string_value = REWARD_SOURCE_HARNESS
    return None


def _finite(value: AnyValue) -> bool:
    """True for a finite number, given as a double, an integer or as text (the views cast text to DOUBLE).

    Numbers only, as POST /v1/rewards takes them: a boolean would be read as 1.0 or 0.0, and other text,
    bytes, arrays and maps as no reward at all.
    """
    kind = value.WhichOneof("value")
    if kind == "double_value":
        return math.isfinite(value.double_value)
    if kind == "int_value":
        return True
    if kind == "string_value":
        try:
            return math.isfinite(float(value.string_value))
        except ValueError:
            return False
    return False


def _quote(text: str) -> str:
    return repr(text if len(text) <= _QUOTED_CHARS else text[:_QUOTED_CHARS] + "…")
