"""The online loop's tasks: a JSONL file, and which task each group gets."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_rl.input_rules import id_problem
from otel_rl.train.config import ConfigError


@dataclass(frozen=True)
class Task:
    """One line of a tasks file: a JSON object with an `id`."""

    task_id: str
    payload: dict[str, Any]


def read_tasks(path: Path) -> list[Task]:
    """The tasks of a JSONL file; errors name the file and line."""
    tasks: list[Task] = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            payload = json.loads(line)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path}:{number}: not JSON ({error})") from None
        if not isinstance(payload, dict) or "id" not in payload:
            raise ConfigError(f'{path}:{number}: a task is a JSON object with an "id"')
        task_id = str(payload["id"])
        problem = id_problem(task_id)  # it becomes otel_rl.task.id: the rule of every identity value
        if problem is not None:
            raise ConfigError(f'{path}:{number}: the task\'s "id" {problem} (docs/attributes.md)')
        tasks.append(Task(task_id, payload))
    if not tasks:
        raise ConfigError(f"{path}: no tasks")
    return tasks


def task_for_group(tasks: Sequence[Task], index: int, seed: int) -> Task:
    """The task of the index-th group: every task once per epoch, in a seeded order per epoch."""
    epoch, position = divmod(index, len(tasks))
    order = list(range(len(tasks)))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return tasks[order[position]]
