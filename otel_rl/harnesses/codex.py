"""Codex CLI as a harness: CODEX_HOME/config.toml with the gateway as its Responses provider, OTLP export."""

import json

from otel_rl.harnesses.recipe import HarnessCLI, Invocation, Run

PROVIDER = "otel_rl"


def toml_string(value: str) -> str:
    # A JSON string without ASCII escaping is a valid TOML basic string: the same quote, backslash and
    # \uXXXX escapes, and characters outside the BMP written as they are (TOML refuses surrogate escapes).
    return json.dumps(value, ensure_ascii=False)


def otlp_http(run: Run, signal: str) -> str:
    endpoint = toml_string(f"{run.contract.otlp_endpoint}/v1/{signal}")
    headers = f"{{ authorization = {toml_string(run.contract.authorization)} }}"
    return f'{{ otlp-http = {{ endpoint = {endpoint}, protocol = "binary", headers = {headers} }} }}'


def config_toml(run: Run) -> str:
    """What Codex reads: the model and provider, no approvals, no vendor services, OTLP to the collector."""
    return f"""\
model = {toml_string(run.model)}
model_provider = "{PROVIDER}"
approval_policy = "never"
# The rollout's folder is a throwaway copy; Codex's own Linux sandbox needs kernel features containers lack.
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
# Codex syncs its plugin marketplace from github.com and chatgpt.com at start: vendor traffic that a coding
# sandbox denies and records (docs/coding.md), which would flag every rollout.
plugins = false

[model_providers.{PROVIDER}]
name = "otel-rl gateway"
base_url = {toml_string(run.contract.openai_base_url)}
wire_api = "responses"
env_key = "OPENAI_API_KEY"

[otel]
environment = "otel-rl"
log_user_prompt = true
exporter = {otlp_http(run, "logs")}
trace_exporter = {otlp_http(run, "traces")}
metrics_exporter = {otlp_http(run, "metrics")}
"""


def invocation(run: Run) -> Invocation:
    codex_home = run.home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(config_toml(run))
    argv = [str(run.executable), "exec", "--skip-git-repo-check", "--cd", str(run.repo), run.task.prompt]
    # Codex joins TRACEPARENT from its environment (set by the runner) and sends traceparent to the gateway.
    return Invocation(argv, {"HOME": str(run.home), "CODEX_HOME": str(codex_home)})


CODEX = HarnessCLI(
    name="codex",
    package="@openai/codex",
    version="0.171.0",
    binary="codex",
    invocation=invocation,
    api="responses",
)
