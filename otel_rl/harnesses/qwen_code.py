"""Qwen Code as a harness: OpenAI-compatible auth from the contract, telemetry in its settings.json."""

import json

from otel_rl.harnesses.recipe import HarnessCLI, Invocation, Run


def invocation(run: Run) -> Invocation:
    settings = {
        "security": {"auth": {"selectedType": "openai"}},
        "model": {"name": run.model},
        "general": {"enableAutoUpdate": False},
        "privacy": {"usageStatisticsEnabled": False},  # no usage statistics to the vendor
        "telemetry": {
            "enabled": True,
            "target": "local",
            "otlpEndpoint": run.contract.otlp_endpoint,
            "otlpProtocol": "http",
            "logPrompts": True,
            "includeSensitiveSpanAttributes": True,
        },
        "outboundCorrelation": {"propagateTraceContext": True},
    }
    (run.home / ".qwen").mkdir(parents=True, exist_ok=True)
    (run.home / ".qwen" / "settings.json").write_text(json.dumps(settings, indent=2))
    # OPENAI_BASE_URL and OPENAI_API_KEY come from the contract as they are.
    env = {"HOME": str(run.home), "OPENAI_MODEL": run.model}
    return Invocation([str(run.executable), "-p", run.task.prompt, "--yolo"], env)


QWEN_CODE = HarnessCLI(
    name="qwen-code",
    package="@qwen-code/qwen-code",
    version="0.24.4",
    binary="qwen",
    invocation=invocation,
    api="chat",
)
