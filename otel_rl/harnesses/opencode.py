"""opencode as a harness: an OpenAI-compatible provider at the gateway, AI SDK telemetry over OTLP."""

import json

from otel_rl.harnesses.recipe import HarnessCLI, Invocation, Run

PROVIDER = "otel_rl"


def invocation(run: Run) -> Invocation:
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",  # bundled in the binary: nothing is downloaded
                "name": "otel-rl gateway",
                "options": {"baseURL": run.contract.openai_base_url, "apiKey": "{env:OPENAI_API_KEY}"},
                "models": {run.model: {"name": run.model}},
            }
        },
        "model": f"{PROVIDER}/{run.model}",
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
        "autoupdate": False,
        "share": "disabled",
        "experimental": {"openTelemetry": True},  # AI SDK spans; the exporter reads OTEL_EXPORTER_OTLP_*
    }
    path = run.home / "opencode.json"
    path.write_text(json.dumps(config, indent=2))
    env = {
        "HOME": str(run.home),
        "OPENCODE_CONFIG": str(path),
        # Only this config: none from the agent's repository, no models.dev catalogue, no vendor services.
        "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        # opencode exits without flushing its span processor: with the default 5 s batch delay the spans of
        # its last calls were lost in most runs; exported within 100 ms they reach the collector.
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    return Invocation([str(run.executable), "run", "--dir", str(run.repo), run.task.prompt], env)


OPENCODE = HarnessCLI(
    name="opencode",
    package="opencode-ai",
    version="1.18.33",
    binary="opencode",
    invocation=invocation,
    api="chat",
)
