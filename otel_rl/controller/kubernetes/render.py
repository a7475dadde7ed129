"""A rollout attempt's Job and Secret, rendered from the user's Job template.

The template is a YAML file holding one `batch/v1` Job. Placeholders are Jinja2 expressions inside YAML
*strings* (quote them: `image: "{{ task.image }}"`); the YAML is parsed first and each string is rendered
on its own, so a task's values can never add keys or change the manifest's structure. Available names:

    task          the task object (`{{ task.repo }}`, `{{ task["difficulty"] }}`)
    task_json     the task as compact JSON (also in the OTEL_RL_TASK variable)
    task_id, group_id, rollout_id, split
    attempt       the attempt number, 1, 2, ...

An undefined name is an error, not an empty string. The first container runs the harness: the config's
`online.harness` becomes its command (so the template must not set `command` or `args` there); other
containers (sidecars) are left as they are. The controller then forces what it owns: the Job's name,
namespace, labels, `backoffLimit: 0`, `restartPolicy: Never`, `activeDeadlineSeconds` (the rollout
timeout), `ttlSecondsAfterFinished`, `suspend: true` (the controller resumes it once the attempt's Secret
exists), and the harness environment of every container (docs/controller.md), with the rollout key read
from the attempt's Secret.
"""

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
import yaml
from jinja2.sandbox import SandboxedEnvironment

from otel_rl import attributes as attr
from otel_rl.controller import environment
from otel_rl.controller.kubernetes import names

MAX_TEMPLATE_BYTES = 1 << 20
# Variables that carry the rollout key: read from the attempt's Secret, never written into the Job.
SECRET_VARS = ("OTEL_EXPORTER_OTLP_HEADERS", "OPENAI_API_KEY", "ANTHROPIC_API_KEY")
CONTRACT_VARS = (*environment.CONTRACT_VARS, "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY")


class TemplateError(ValueError):
    """A Job template that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class Attempt:
    """What one attempt's Job needs to know: its identity and its place in the trace."""

    rollout_id: str
    attempt: int  # 1, 2, ...
    attempt_id: str
    group_id: str
    task_id: str
    split: str
    run_id: str
    task: Mapping[str, Any]
    traceparent: str
    started_ns: int

    @property
    def identity(self) -> dict[str, str]:
        return {
            attr.ROLLOUT_ID: self.rollout_id,
            attr.ATTEMPT_ID: self.attempt_id,
            attr.GROUP_ID: self.group_id,
            attr.TASK_ID: self.task_id,
            attr.SPLIT: self.split,
        }

    @property
    def labels(self) -> dict[str, str]:
        return {
            names.RUN: names.label_value(self.run_id),
            names.ROLLOUT: names.label_value(self.rollout_id),
            names.ATTEMPT: str(self.attempt),
            names.GROUP: names.label_value(self.group_id),
            names.TASK: names.label_value(self.task_id),
        }


def load_template(path: Path) -> dict[str, Any]:
    """The parsed Job template, checked for what the renderer relies on."""
    try:
        with path.open("rb") as file:
            text = file.read(MAX_TEMPLATE_BYTES + 1)
    except OSError as error:
        raise TemplateError(f"cannot read the Job template {path}: {error}") from None
    if len(text) > MAX_TEMPLATE_BYTES:
        raise TemplateError(f"{path}: a Job template is at most {MAX_TEMPLATE_BYTES} bytes")
    try:
        manifest = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise TemplateError(f"{path} is not valid YAML (quote every placeholder): {error}") from None
    if not isinstance(manifest, dict) or manifest.get("kind") != "Job":
        raise TemplateError(f"{path}: the template must be one mapping with `kind: Job`")
    if manifest.get("apiVersion") != "batch/v1":
        raise TemplateError(f"{path}: apiVersion must be batch/v1, not {manifest.get('apiVersion')!r}")
    containers = _get(manifest, "spec", "template", "spec", "containers")
    if not isinstance(containers, list) or not containers or not all(isinstance(c, dict) for c in containers):
        raise TemplateError(f"{path}: spec.template.spec.containers must be a non-empty list")
    harness = containers[0]
    if "command" in harness or "args" in harness:
        raise TemplateError(f"{path}: the first container runs `online.harness`: remove its command and args")
    for container in containers:
        for entry in container.get("env") or []:
            if isinstance(entry, dict) and entry.get("name") in CONTRACT_VARS:
                raise TemplateError(
                    f"{path}: container {container.get('name')!r} sets {entry['name']}: "
                    "the controller sets it per attempt"
                )
    return manifest


def render_job(
    template: Mapping[str, Any],
    attempt: Attempt,
    *,
    namespace: str,
    command: str | Sequence[str],
    timeout_s: float,
    ttl_seconds_after_finished: int,
    server_url: str,
    user_env: Mapping[str, str],
) -> dict[str, Any]:
    """The Job manifest of one attempt: the template rendered, then the fields the controller owns forced."""
    values = {
        "task": attempt.task,
        "task_json": environment.task_json(attempt.task),
        "task_id": attempt.task_id,
        "group_id": attempt.group_id,
        "rollout_id": attempt.rollout_id,
        "split": attempt.split,
        "attempt": attempt.attempt,
    }
    job = _render(copy.deepcopy(dict(template)), _ENVIRONMENT, values)
    name = names.job_name(attempt.rollout_id, attempt.attempt)
    metadata = job.setdefault("metadata", {})
    metadata.pop("generateName", None)
    metadata.update(name=name, namespace=namespace)
    metadata["labels"] = {**(metadata.get("labels") or {}), **attempt.labels}
    metadata["annotations"] = {**(metadata.get("annotations") or {}), **_annotations(attempt)}
    spec = job["spec"]
    spec.update(
        backoffLimit=0,
        activeDeadlineSeconds=max(1, math.ceil(timeout_s)),
        ttlSecondsAfterFinished=ttl_seconds_after_finished,
        suspend=True,
        completions=1,
        parallelism=1,
    )
    for key in ("selector", "manualSelector", "podFailurePolicy", "successPolicy"):
        spec.pop(key, None)
    pod = spec["template"]
    pod_metadata = pod.setdefault("metadata", {})
    pod_metadata["labels"] = {**(pod_metadata.get("labels") or {}), **attempt.labels}
    pod["spec"]["restartPolicy"] = "Never"
    argv = environment.harness_argv(command, attempt.task)
    containers = pod["spec"]["containers"]
    containers[0]["command"] = argv
    env = _container_env(attempt, name, server_url, user_env)
    for container in (*containers, *(pod["spec"].get("initContainers") or [])):
        container["env"] = [*(container.get("env") or []), *env]
    return job


def render_secret(attempt: Attempt, api_key: str, owner_uid: str) -> dict[str, Any]:
    """The attempt's Secret: its rollout key in each form the contract uses; collected with its Job."""
    name = names.job_name(attempt.rollout_id, attempt.attempt)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "labels": attempt.labels,
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": owner_uid, "controller": True}
            ],
        },
        "stringData": {
            "OTEL_EXPORTER_OTLP_HEADERS": f"authorization={quote(f'Bearer {api_key}', safe='')}",
            "OPENAI_API_KEY": api_key,
            "ANTHROPIC_API_KEY": api_key,
        },
    }


def _container_env(
    attempt: Attempt, secret: str, server_url: str, user_env: Mapping[str, str]
) -> list[dict[str, Any]]:
    plain = {
        **user_env,
        "OTEL_EXPORTER_OTLP_ENDPOINT": server_url,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_RESOURCE_ATTRIBUTES": environment.resource_attributes(attempt.identity),
        "OPENAI_BASE_URL": f"{server_url}/v1",
        "ANTHROPIC_BASE_URL": server_url,  # Anthropic clients append /v1/messages themselves
        "TRACEPARENT": attempt.traceparent,
        "OTEL_RL_TASK": environment.task_json(attempt.task),
    }
    secret_refs = [
        {"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": var}}} for var in SECRET_VARS
    ]
    return [{"name": key, "value": value} for key, value in plain.items()] + secret_refs


def _annotations(attempt: Attempt) -> dict[str, str]:
    return {
        names.ROLLOUT_ID: attempt.rollout_id,
        names.ATTEMPT_ID: attempt.attempt_id,
        names.GROUP_ID: attempt.group_id,
        names.TASK_ID: attempt.task_id,
        names.SPLIT: attempt.split,
        names.TRACEPARENT: attempt.traceparent,
        names.STARTED_NS: str(attempt.started_ns),
    }


def _render(node: Any, env: SandboxedEnvironment, values: Mapping[str, Any]) -> Any:
    if isinstance(node, str):
        if "{{" not in node and "{%" not in node:
            return node
        try:
            return env.from_string(node).render(values)
        except jinja2.TemplateError as error:
            raise TemplateError(f"Job template placeholder {node!r}: {error}") from None
    if isinstance(node, list):
        return [_render(item, env, values) for item in node]
    if isinstance(node, dict):
        return {key: _render(value, env, values) for key, value in node.items()}
    return node


def _get(node: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


_ENVIRONMENT = SandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False)
