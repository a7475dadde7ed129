"""Claude Code as a harness: the gateway as its Anthropic base URL, its OTel export switched on by env."""

from otel_rl.harnesses.recipe import HarnessCLI, Invocation, Run

# The tools a coding rollout may use without asking (print mode has no one to ask).
ALLOWED_TOOLS = "Bash,Read,Edit,Write,Glob,Grep"


def invocation(run: Run) -> Invocation:
    env = {
        "HOME": str(run.home),
        "ANTHROPIC_BASE_URL": run.contract.gateway_root,  # the server root: Claude Code appends /v1/messages
        "ANTHROPIC_API_KEY": run.contract.api_key,
        # Every model role (the main loop and the small background calls) is the policy the gateway serves.
        "ANTHROPIC_MODEL": run.model,
        "ANTHROPIC_SMALL_FAST_MODEL": run.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": run.model,
        "CLAUDE_CODE_ENABLE_TELEMETRY": "1",
        "OTEL_LOGS_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_LOG_USER_PROMPTS": "1",
        "OTEL_LOG_TOOL_DETAILS": "1",
        "CLAUDE_CODE_ENHANCED_TELEMETRY_BETA": "1",  # spans: interaction, llm_request, tool
        "CLAUDE_CODE_PROPAGATE_TRACEPARENT": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # no vendor hosts: updates, error reports, statsig
    }
    argv = [str(run.executable), "-p", run.task.prompt, "--model", run.model, "--allowedTools", ALLOWED_TOOLS]
    return Invocation(argv, env)


CLAUDE_CODE = HarnessCLI(
    name="claude-code",
    package="@anthropic-ai/claude-code",
    version="2.1.332",
    binary="claude",
    invocation=invocation,
    api="messages",
)
