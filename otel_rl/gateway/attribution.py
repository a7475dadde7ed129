"""Who a call is for: the rollout of its key, W3C baggage, X-OTel-RL-* headers; and its trace parent.

The rollout key is the authority: a harness holding one cannot claim another rollout. The identity given
when the key was issued (attempt, group, task, split), stored with the key, applies to every call made with
it, so a harness that only sets OPENAI_API_KEY is fully attributed. Baggage and headers fill in what the key
does not say.
"""

from collections.abc import Mapping

from opentelemetry import baggage
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from otel_rl.attributes import IDENTITY_HEADERS, IDENTITY_KEYS, ROLLOUT_ID, SPLIT
from otel_rl.auth import Forbidden, Principal
from otel_rl.input_rules import check_identity
from otel_rl.store.identity import identity_of, resolve, rollout_key_identity

_TRACE_CONTEXT = TraceContextTextMapPropagator()
_BAGGAGE = W3CBaggagePropagator()
SPLITS = ("train", "val")


def key_identity(rollout_id: str, given: Mapping[str, str | None]) -> dict[str, str]:
    """The identity a rollout key is issued with: its rollout, and the otel_rl.* keys given (not None)."""
    full = {key: str(value) for key, value in given.items() if key in IDENTITY_KEYS and value is not None}
    full[ROLLOUT_ID] = rollout_id
    _check_split(full)
    return full


def caller_identity(principal: Principal, headers: Mapping[str, str]) -> dict[str, str]:
    """The rollout identity of a call; Forbidden when a rollout key claims another rollout.

    A rollout key's call is attributed to the identity that key was issued with (its attempt's, stored with
    it), never to a later key's: an attempt that was retried cannot put its calls into the new attempt.
    """
    identity: dict[str, str] = {}
    if "baggage" in headers:
        entries = baggage.get_all(_BAGGAGE.extract(headers))
        identity.update({key: str(entries[key]) for key in IDENTITY_KEYS if key in entries})
    for key, header in IDENTITY_HEADERS.items():
        value = headers.get(header)
        if value:
            identity[key] = value
    if principal.rollout_id is not None:
        claimed = identity.get(ROLLOUT_ID)
        if claimed is not None and claimed != principal.rollout_id:
            raise Forbidden(f"this key is for rollout {principal.rollout_id!r}, not {claimed!r}")
        # the rule the collector stores every record's identity by: the key's before what the call says
        key = rollout_key_identity(principal.rollout_id, principal.identity)
        resolved = zip(IDENTITY_KEYS, resolve(key, identity_of(identity)), strict=True)
        identity = {name: value for name, value in resolved if value is not None}
    check_identity(identity)  # headers and baggage are held to the rule of every route (input_rules.py)
    _check_split(identity)
    return identity


def trace_parent(headers: Mapping[str, str]) -> Context:
    """The caller's trace context from `traceparent`, or an empty context (the call's span is a root)."""
    if "traceparent" not in headers:
        return Context()
    return _TRACE_CONTEXT.extract(headers, context=Context())


def _check_split(identity: Mapping[str, str]) -> None:
    split = identity.get(SPLIT)
    if split is not None and split not in SPLITS:
        raise ValueError(f"{SPLIT} must be one of {', '.join(SPLITS)}, not {split!r}")
