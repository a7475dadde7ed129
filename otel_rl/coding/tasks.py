"""The task format (SWE-bench instances as published, plus `repo_path`) and loading a JSONL file of them."""

import json
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# Bounds on hostile input, checked before anything is allocated for it.
MAX_FILE_BYTES = 1 << 30
MAX_LINE_BYTES = 64 << 20
MAX_TASKS = 100_000
MAX_TEST_IDS = 10_000

InstanceId = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-/]*$")]


class TaskError(ValueError):
    """A task file or line that cannot be used; the message names the line, the instance and the reason."""


class Task(BaseModel):
    """One repository task. `test_patch` (the hidden tests) and `patch` (the gold fix) are grader-side only:
    nothing here copies them into an agent's workspace."""

    # Published instances carry more fields (version, created_at, hints_text, ...): kept out, not refused.
    model_config = ConfigDict(extra="ignore", frozen=True)

    instance_id: InstanceId
    repo: str = Field(max_length=400)
    base_commit: str = Field(min_length=1, max_length=200)
    problem_statement: str
    FAIL_TO_PASS: list[str] = Field(max_length=MAX_TEST_IDS)
    PASS_TO_PASS: list[str] = Field(max_length=MAX_TEST_IDS)
    test_patch: str
    patch: str
    repo_path: str = Field(min_length=1, max_length=4096)

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _test_ids(cls, value: object) -> object:
        # SWE-bench's own files hold these as JSON strings of lists; both forms are published.
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError as error:
                raise ValueError(f"not a list nor a JSON string of a list ({error.msg})") from None
        return value

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS")
    @classmethod
    def _test_id_shape(cls, ids: list[str]) -> list[str]:
        for test_id in ids:
            if not test_id or len(test_id) > 2000 or "\n" in test_id:
                raise ValueError(f"test id {test_id[:80]!r} is empty, multi-line or over 2000 characters")
        return ids

    @property
    def expected_tests(self) -> list[str]:
        """Every test id that must pass for reward 1, in order, without duplicates."""
        return list(dict.fromkeys([*self.FAIL_TO_PASS, *self.PASS_TO_PASS]))


class TaskSet(BaseModel):
    """The tasks of one file, with the folder `repo_path` is relative to."""

    path: Path
    tasks: list[Task]

    def get(self, instance_id: str) -> Task:
        for task in self.tasks:
            if task.instance_id == instance_id:
                return task
        raise TaskError(f"{self.path}: no task with instance_id {instance_id!r}")

    def repo_dir(self, task: Task) -> Path:
        """The task's local repository: `repo_path` resolved against the task file's folder."""
        directory = (self.path.parent / task.repo_path).resolve()
        if not directory.is_dir():
            raise TaskError(f"{task.instance_id}: repo_path {task.repo_path!r} is not a folder ({directory})")
        return directory


def parse_task(line: str, *, where: str) -> Task:
    """One JSONL line as a task; `where` (file:line) leads every error."""
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as error:
        raise TaskError(f"{where}: not JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(raw, dict):
        raise TaskError(f"{where}: a task is a JSON object, got {type(raw).__name__}")
    name = raw.get("instance_id")
    label = f"{where} ({name})" if isinstance(name, str) else where
    try:
        return Task.model_validate(raw)
    except ValidationError as error:
        reasons = "; ".join(
            f"{'.'.join(str(part) for part in item['loc']) or 'task'}: {item['msg']}"
            for item in error.errors()
        )
        raise TaskError(f"{label}: {reasons}") from None


def load_tasks(path: Path) -> TaskSet:
    """Every task of a JSONL file (blank lines skipped); instance ids must be unique. The first bad line
    raises TaskError."""
    task_set, bad = load_tasks_and_errors(path)
    if bad:
        raise bad[0]
    return task_set


def load_tasks_and_errors(path: Path) -> tuple[TaskSet, list[TaskError]]:
    """The file's good tasks, and an error for each bad line (naming the line, the instance when it has one,
    and the reason): for a command that goes on with the other tasks. A file that cannot be read at all (no
    file, over MAX_FILE_BYTES, over MAX_TASKS tasks) raises TaskError."""
    if not path.is_file():
        raise TaskError(f"{path}: no such task file")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise TaskError(f"{path}: over {MAX_FILE_BYTES >> 20} MiB")
    tasks: list[Task] = []
    bad: list[TaskError] = []
    seen: set[str] = set()
    with path.open("rb") as lines:
        for number, data in enumerate(lines, start=1):
            where = f"{path}:{number}"
            if len(tasks) + len(bad) >= MAX_TASKS:
                raise TaskError(f"{where}: over {MAX_TASKS} tasks in one file")
            try:
                task = _task_of_line(data, where)
            except TaskError as error:
                bad.append(error)
                continue
            if task is None:
                continue
            if task.instance_id in seen:
                bad.append(TaskError(f"{where} ({task.instance_id}): instance_id appears twice"))
                continue
            seen.add(task.instance_id)
            tasks.append(task)
    return TaskSet(path=path, tasks=tasks), bad


def _task_of_line(data: bytes, where: str) -> Task | None:
    if len(data) > MAX_LINE_BYTES:
        raise TaskError(f"{where}: line over {MAX_LINE_BYTES >> 20} MiB")
    try:
        line = data.decode()
    except UnicodeDecodeError:
        raise TaskError(f"{where}: not UTF-8") from None
    return parse_task(line, where=where) if line.strip() else None
