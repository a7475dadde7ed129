"""The environment contract between the rollout controller and a harness process (docs/controller.md)."""

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Annotated, Any
from urllib.parse import quote

from opentelemetry.trace import SpanContext
from pydantic import AfterValidator

# The variables the controller sets for every harness; anything else comes from the controller's
# own environment (minus the prefixes below) and the user's `env` setting.
CONTRACT_VARS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "TRACEPARENT",
    "OTEL_RL_TASK",
)
# Inherited variables with these prefixes would silently redirect or re-label a harness's telemetry
# or model calls (an OTEL_TRACES_EXPORTER=console in the operator's shell, a real OpenAI key, a BAGGAGE
# naming another rollout), so the controller drops them; the user's `env` setting may set them again.
STRIPPED_PREFIXES = ("OTEL_", "OPENAI_", "TRACEPARENT", "TRACESTATE", "BAGGAGE")


def task_json(task: Mapping[str, Any]) -> str:
    """The task as the harness receives it (in OTEL_RL_TASK and for `{task}` in the command)."""
    return json.dumps(task, separators=(",", ":"), sort_keys=True)


def traceparent(context: SpanContext) -> str:
    """The W3C traceparent header value for a span context."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def resource_attributes(identity: Mapping[str, str]) -> str:
    """OTEL_RESOURCE_ATTRIBUTES for a rollout identity (values percent-encoded, as the spec requires)."""
    return ",".join(f"{key}={quote(str(value), safe='')}" for key, value in identity.items())


def base_environment(inherited: Mapping[str, str], user_env: Mapping[str, str]) -> dict[str, str]:
    """What every harness process shares: the inherited environment, filtered, plus the user's settings."""
    return {key: value for key, value in inherited.items() if not key.startswith(STRIPPED_PREFIXES)} | dict(
        user_env
    )


def harness_environment(
    *,
    inherited: Mapping[str, str],
    user_env: Mapping[str, str],
    otlp_endpoint: str,
    openai_base_url: str,
    api_key: str,
    identity: Mapping[str, str],
    parent: SpanContext,
    task: Mapping[str, Any],
) -> dict[str, str]:
    """The complete environment of one harness process: inherited + user settings + the contract."""
    env = base_environment(inherited, user_env)
    env.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_HEADERS": f"authorization={quote(f'Bearer {api_key}', safe='')}",
            "OTEL_RESOURCE_ATTRIBUTES": resource_attributes(identity),
            "OPENAI_BASE_URL": openai_base_url,
            "OPENAI_API_KEY": api_key,
            "TRACEPARENT": traceparent(parent),
            "OTEL_RL_TASK": task_json(task),
        }
    )
    return env


def harness_argv(command: str | Sequence[str], task: Mapping[str, Any]) -> list[str]:
    """The argv to execute: a list is run directly, a string through `/bin/sh -c`; `{task}` → task JSON."""
    text = task_json(task)
    if isinstance(command, str):
        return ["/bin/sh", "-c", command.replace("{task}", shlex.quote(text))]
    return [part.replace("{task}", text) for part in command]


def validate_user_env(user_env: Mapping[str, str]) -> Mapping[str, str]:
    """`user_env`, unless it would overwrite a contract variable (ValueError naming them)."""
    clashes = sorted(set(user_env) & set(CONTRACT_VARS))
    if clashes:
        names = ", ".join(clashes)
        raise ValueError(f"harness env may not set {names}: the controller sets them per rollout")
    return user_env


# A setting of extra variables for harnesses (the controller's `env`, a training config's `online.env`)
HarnessEnv = Annotated[dict[str, str], AfterValidator(validate_user_env)]
