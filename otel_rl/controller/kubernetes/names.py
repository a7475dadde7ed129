"""Names and labels of rollout Jobs: what the controller finds its Jobs by, after a restart too."""

import hashlib
import re

LABEL_PREFIX = "otel-rl.dev/"
RUN = LABEL_PREFIX + "run"
ROLLOUT = LABEL_PREFIX + "rollout"
ATTEMPT = LABEL_PREFIX + "attempt"  # the attempt number, 1, 2, ... (its id is an annotation)
GROUP = LABEL_PREFIX + "group"
TASK = LABEL_PREFIX + "task"
# Annotations: the full values (labels are limited to 63 characters) and the attempt's record.
ROLLOUT_ID = LABEL_PREFIX + "rollout-id"
ATTEMPT_ID = LABEL_PREFIX + "attempt-id"
TASK_ID = LABEL_PREFIX + "task-id"
GROUP_ID = LABEL_PREFIX + "group-id"
SPLIT = LABEL_PREFIX + "split"
TRACEPARENT = LABEL_PREFIX + "traceparent"
STARTED_NS = LABEL_PREFIX + "started-unix-nano"
RESULT = LABEL_PREFIX + "result"  # JSON {status, exit_code, duration_s, reason}: the span was exported

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def check_dns_label(value: str, what: str) -> None:
    """Raise ValueError unless value is an RFC 1123 label (namespaces, Job names)."""
    if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        raise ValueError(f"{what} {value!r} is not a DNS label (a-z, 0-9 and '-', at most 63 characters)")


def label_value(value: str) -> str:
    """value itself when Kubernetes accepts it as a label value, else a stable digest of it."""
    if len(value) <= 63 and _LABEL_VALUE.fullmatch(value):
        return value
    return "h-" + hashlib.sha256(value.encode()).hexdigest()[:40]


def job_name(rollout_id: str, attempt: int) -> str:
    """The Job (and Secret) of one attempt: fixed by rollout and attempt number, so that a create repeated
    after a lost answer, or by a restarted controller, finds the Job instead of making a second one."""
    name = f"otel-rl-{label_value(rollout_id).lower().replace('_', '-').replace('.', '-')}"[:52]
    name = f"{name.rstrip('-')}-a{attempt}"
    check_dns_label(name, "Job name")
    return name


def selector(labels: dict[str, str]) -> str:
    """A label selector matching every one of labels."""
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
