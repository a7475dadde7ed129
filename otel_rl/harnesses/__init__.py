"""Coding-agent CLIs as rollout harnesses: one recipe per CLI, run by `otel-rl harness <cli>`."""

from otel_rl.harnesses.claude_code import CLAUDE_CODE
from otel_rl.harnesses.codex import CODEX
from otel_rl.harnesses.opencode import OPENCODE
from otel_rl.harnesses.qwen_code import QWEN_CODE
from otel_rl.harnesses.recipe import HarnessCLI

CLIS: dict[str, HarnessCLI] = {cli.name: cli for cli in (CODEX, CLAUDE_CODE, QWEN_CODE, OPENCODE)}
