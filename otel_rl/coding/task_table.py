"""The store's `tasks` table: a task file's public fields, one row a task (`otel-rl tasks load`), written by
the store's writer on the file or through the server holding it (POST /v1/admin/tasks)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from otel_rl.coding.tasks import MAX_TASKS, MAX_TEST_IDS, Task, TaskSet
from otel_rl.store.arrow_rows import rows_table
from otel_rl.store.layout import SENDER_ADMIN, TASKS

if TYPE_CHECKING:
    import pyarrow as pa
    from fastapi import APIRouter

    from otel_rl.auth import Auth
    from otel_rl.store import Store

MAX_BODY_BYTES = 256 << 20  # a request of public fields: a task file's problem statements and test ids


class PublicTask(BaseModel):
    """What the table holds of a task: never `test_patch` nor `patch` (they stay in the task file)."""

    instance_id: str = Field(min_length=1, max_length=200)
    repo: str = Field(max_length=400)
    base_commit: str = Field(max_length=200)
    problem_statement: str = Field(max_length=1 << 20)
    FAIL_TO_PASS: list[str] = Field(max_length=MAX_TEST_IDS)
    PASS_TO_PASS: list[str] = Field(max_length=MAX_TEST_IDS)
    task_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class TasksIn(BaseModel):
    """The body of POST /v1/admin/tasks."""

    task_set: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    task_file: str = Field(max_length=4096)
    tasks: list[PublicTask] = Field(max_length=MAX_TASKS)


def public(task: Task) -> PublicTask:
    """The task's public fields and the hash of the whole task (its version: a changed task is a new row)."""
    digest = hashlib.sha256(task.model_dump_json().encode()).hexdigest()
    fields = task.model_dump(exclude={"test_patch", "patch", "repo_path"})
    return PublicTask(**fields, task_sha256=digest)


def tasks_in(task_set: TaskSet, name: str | None) -> TasksIn:
    """A loaded task file as the rows to store, under `name` (else the file's stem)."""
    return TasksIn(
        task_set=name or task_set.path.stem,
        task_file=str(task_set.path.resolve()),
        tasks=[public(task) for task in task_set.tasks],
    )


def task_rows(body: TasksIn) -> pa.Table:
    """The `tasks` rows of a load, received now from the admin."""
    rows = [
        TASKS.row(
            task_set=body.task_set,
            instance_id=task.instance_id,
            repo=task.repo,
            base_commit=task.base_commit,
            problem_statement=task.problem_statement,
            fail_to_pass=task.FAIL_TO_PASS,
            pass_to_pass=task.PASS_TO_PASS,
            task_file=body.task_file,
            task_sha256=task.task_sha256,
        )  # fmt: skip
        for task in body.tasks
    ]
    return rows_table(TASKS, rows, datetime.now(UTC), SENDER_ADMIN)


def store_tasks(store: Store, body: TasksIn) -> int:
    """Write the rows through the store's writer (rows stored already, same set, id and version, are
    skipped); how many the load named."""
    store.write({TASKS.table: task_rows(body)}, TASKS.table)
    return len(body.tasks)


def load_file(task_set: TaskSet, name: str | None, db: Path) -> int:
    """Load into the store file `db` itself (no server holds it)."""
    from otel_rl.store import Store

    with Store(db) as store:
        return store_tasks(store, tasks_in(task_set, name))


def tasks_router(store: Store, auth: Auth) -> APIRouter:
    """POST /v1/admin/tasks (admin token only): what `otel-rl tasks load` sends a server holding the store."""
    import asyncio

    from fastapi import APIRouter, Depends, HTTPException

    from otel_rl.auth import admin_required
    from otel_rl.store.writer import Saturated, StoreUnavailable

    router = APIRouter(tags=["tasks"])

    @router.post(
        "/v1/admin/tasks",
        summary="Store a task file's public fields in the tasks table",
        dependencies=[Depends(admin_required(auth))],
        max_body_size=MAX_BODY_BYTES,
    )
    async def load_tasks(body: TasksIn) -> dict:
        try:
            await asyncio.wrap_future(store.submit({TASKS.table: task_rows(body)}))
        except (Saturated, StoreUnavailable) as exc:
            raise HTTPException(503, str(exc), headers={"Retry-After": "1"}) from None
        return {"task_set": body.task_set, "tasks": len(body.tasks)}

    return router
