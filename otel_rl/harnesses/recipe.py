"""What a CLI recipe is given (the rollout contract, the coding task, the rollout's folder) and returns."""

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

MAX_PROMPT_CHARS = 100_000
DEFAULT_TIMEOUT_S = 300.0
# A coding task's prompt: its problem statement, about the repository the CLI starts in.
CODING_PROMPT = (
    "The repository in the current folder has this issue:\n\n{statement}\n\n"
    "Change its source so that the issue is resolved."
)


class HarnessError(RuntimeError):
    """The harness cannot run: a contract variable or a task field is missing or wrong."""


@dataclass(frozen=True)
class Contract:
    """The environment the rollout controller gives every harness (docs/controller.md)."""

    otlp_endpoint: str  # the collector's base URL
    otlp_headers: str  # OTEL_EXPORTER_OTLP_HEADERS as given (percent-encoded)
    resource_attributes: str  # OTEL_RESOURCE_ATTRIBUTES: the rollout identity
    openai_base_url: str  # the gateway, ending in /v1
    api_key: str  # the rollout-scoped key
    task: Mapping[str, Any]

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "Contract":
        names = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_RESOURCE_ATTRIBUTES",
                 "OPENAI_BASE_URL", "OPENAI_API_KEY", "OTEL_RL_TASK")  # fmt: skip
        missing = [name for name in names if not environ.get(name)]
        if missing:
            raise HarnessError(
                f"missing {', '.join(missing)}: run the harness under the rollout controller "
                "(docs/controller.md), or set these variables yourself"
            )
        try:
            task = json.loads(environ["OTEL_RL_TASK"])
        except json.JSONDecodeError as error:
            raise HarnessError(f"OTEL_RL_TASK is not JSON: {error}") from None
        if not isinstance(task, dict):
            raise HarnessError("OTEL_RL_TASK must be a JSON object")
        return cls(
            otlp_endpoint=environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/"),
            otlp_headers=environ["OTEL_EXPORTER_OTLP_HEADERS"],
            resource_attributes=environ["OTEL_RESOURCE_ATTRIBUTES"],
            openai_base_url=environ["OPENAI_BASE_URL"].rstrip("/"),
            api_key=environ["OPENAI_API_KEY"],
            task=task,
        )

    @property
    def gateway_root(self) -> str:
        """The gateway's base URL without `/v1` (what Anthropic clients take as their base URL)."""
        return re.sub(r"/v1$", "", self.openai_base_url)

    @property
    def authorization(self) -> str:
        """The collector's `authorization` header value (`Bearer <key>`), decoded."""
        for item in self.otlp_headers.split(","):
            key, _, value = item.partition("=")
            if key.strip().lower() == "authorization":
                return unquote(value.strip())
        raise HarnessError("OTEL_EXPORTER_OTLP_HEADERS has no authorization header")


@dataclass(frozen=True)
class CodingTask:
    """What the CLI is asked to do, and where. Two shapes:

    - a coding task (docs/coding.md: `instance_id`, `problem_statement`), run by the coding launcher in its
      sandbox: the agent works in place in its workspace (the working directory), and the grader outside
      the sandbox posts the reward (`check` is None);
    - a folder task (`prompt`, `repo`, `check`): the repository is copied into the rollout's folder, and the
      check's result, run beside the agent, is the reward (source `harness`). Paths are relative to the
      harness's working directory (the controller's), as in the controller's command.
    """

    id: str
    prompt: str
    repo: Path  # the agent's working copy: the workspace itself, or copied from here
    check: Path | None  # a Python script run as `python check.py REPO`: exit status 0 = solved (reward 1)
    timeout_s: float  # for the CLI; the check has its own bound

    @classmethod
    def from_task(cls, task: Mapping[str, Any]) -> "CodingTask":
        if "problem_statement" in task and "check" not in task:
            return cls.from_coding_task(task)
        prompt, repo, check = task.get("prompt"), task.get("repo"), task.get("check")
        if not isinstance(prompt, str) or not prompt or len(prompt) > MAX_PROMPT_CHARS:
            raise HarnessError(f"task.prompt must be a non-empty string of at most {MAX_PROMPT_CHARS} chars")
        for field, value in (("repo", repo), ("check", check)):
            if not isinstance(value, str) or not value:
                raise HarnessError(f"task.{field} must be a path (relative to the working directory)")
        repo_path, check_path = Path(repo).resolve(), Path(check).resolve()
        if not repo_path.is_dir():
            raise HarnessError(f"task.repo {repo!r} is not a folder")
        if not check_path.is_file():
            raise HarnessError(f"task.check {check!r} is not a file")
        return cls(str(task.get("id", repo_path.name)), prompt, repo_path, check_path, _timeout(task))

    @classmethod
    def from_coding_task(cls, task: Mapping[str, Any]) -> "CodingTask":
        """A coding task's agent-side fields (otel_rl/controller/coding.py `agent_task`); the workspace is the
        working directory."""
        instance, statement = task.get("instance_id"), task.get("problem_statement")
        if not isinstance(instance, str) or not instance:
            raise HarnessError("task.instance_id must be a non-empty string")
        if not isinstance(statement, str) or not statement.strip() or len(statement) > MAX_PROMPT_CHARS:
            raise HarnessError(
                f"task.problem_statement must be a non-empty string of at most {MAX_PROMPT_CHARS} chars"
            )
        return cls(instance, CODING_PROMPT.format(statement=statement), Path.cwd(), None, _timeout(task))


def _timeout(task: Mapping[str, Any]) -> float:
    timeout_s = task.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s <= 3600:
        raise HarnessError(f"task.timeout_s must be a number of seconds in (0, 3600], not {timeout_s!r}")
    return float(timeout_s)


@dataclass(frozen=True)
class Run:
    """One rollout's run of a CLI: everything a recipe needs to write its config and command line."""

    contract: Contract
    task: CodingTask
    executable: Path  # the installed CLI
    model: str  # the model name the gateway serves
    repo: Path  # the agent's working copy of the task's repository (its cwd)
    home: Path  # HOME and config folders of this rollout only: nothing is read from the user's


@dataclass(frozen=True)
class Invocation:
    """How to start the CLI: its argv and the variables added to the harness's environment."""

    argv: list[str]
    env: dict[str, str]


@dataclass(frozen=True)
class HarnessCLI:
    """A coding-agent CLI: its pinned npm package and how to run it non-interactively as a rollout."""

    name: str
    package: str
    version: str
    binary: str
    invocation: Callable[[Run], Invocation]
    api: str  # the gateway API it calls: "chat", "responses" or "messages"
