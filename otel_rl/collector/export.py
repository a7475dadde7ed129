"""One OTLP export, whatever the transport: scope it to the caller's rollout, flatten, and build the reply."""

from collections.abc import Iterable, Iterator, MutableSequence
from dataclasses import dataclass

from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from otel_rl.attributes import ROLLOUT_ID
from otel_rl.auth import Principal
from otel_rl.collector.decode import RESPONSE_TYPES, DecodeError, ExportRequest, ExportResponse, Signal
from otel_rl.store import Store
from otel_rl.store.writer import Batch

# The partial_success field that counts each signal's rejected records.
_REJECTED_FIELD: dict[Signal, str] = {
    "traces": "rejected_spans",
    "logs": "rejected_log_records",
    "metrics": "rejected_data_points",
}


@dataclass(frozen=True)
class PreparedExport:
    """The rows to write for an export and the response to send once they are committed."""

    batch: Batch
    response: ExportResponse


def prepare_export(
    store: Store, signal: Signal, request: ExportRequest, principal: Principal
) -> PreparedExport:
    """Rows and response of an export; a rollout-scoped caller's records for other rollouts are rejected."""
    rejected = 0
    if not principal.admin:
        rejected = drop_other_rollouts(signal, request, principal.rollout_id or "")
    try:
        batch = _flatten(store, signal, request)
    except ValueError as exc:  # e.g. a packed token attribute whose length is not a multiple of 4
        raise DecodeError(f"{signal} request has invalid content: {exc}") from None
    response = RESPONSE_TYPES[signal]()
    if rejected:
        partial = response.partial_success
        setattr(partial, _REJECTED_FIELD[signal], rejected)
        partial.error_message = (
            f"{rejected} record(s) rejected: they belong to another rollout than this key's "
            f"({principal.rollout_id!r})"
        )
    return PreparedExport(batch=batch, response=response)


def _flatten(store: Store, signal: Signal, request: ExportRequest) -> Batch:
    if signal == "traces":
        return store.traces_batch(request)
    if signal == "logs":
        return store.logs_batch(request)
    return store.metrics_batch(request)


def drop_other_rollouts(signal: Signal, request: ExportRequest, rollout_id: str) -> int:
    """Remove records whose rollout id (own attributes, else resource) is not `rollout_id`; returns how many.

    Records that name no rollout are kept.
    """
    rejected = 0
    for resource, records in _record_lists(signal, request):
        resource_rollout = _rollout_of(resource.attributes)
        kept = [r for r in records if (_rollout_of(r.attributes) or resource_rollout) in (None, rollout_id)]
        if len(kept) < len(records):
            rejected += len(records) - len(kept)
            del records[:]
            records.extend(kept)
    return rejected


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


def _rollout_of(attributes: Iterable[KeyValue]) -> str | None:
    for kv in attributes:
        if kv.key == ROLLOUT_ID:
            return kv.value.string_value
    return None
