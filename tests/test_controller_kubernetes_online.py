"""A restarted online run takes back the Kubernetes Jobs its killed predecessor left running.

A controller of run R runs in its own process (tests/kube_child.py) and is killed with SIGKILL while its
pods run; a new controller of run R, against the same API server stand-in (tests/kube_api.py) and the same
real otel-rl server, finds those rollouts (`in_flight`) and awaits them through `run_rollout`, directly or
as the online loop's launcher does: one status span per attempt, no attempt's Job created twice, none lost.
"""

import asyncio
import json
import time

import pytest
from kube_api import Fault, KubeApiStandIn
from kube_child import RUN_ID, controller_for, leave_jobs_behind

from otel_rl.controller import Rollout, RolloutStatus, new_id
from otel_rl.controller.kubernetes import names
from otel_rl.controller.kubernetes.adopt import unfinished_rollouts
from otel_rl.train.config import TrainConfig
from otel_rl.train.launcher import GroupLauncher, adoptable_groups
from otel_rl.train.resume import OnlineState
from otel_rl.train.server_client import ServerClient
from otel_rl.train.tasks import Task


def rollout(behaviour: str, group_id: str | None = None) -> Rollout:
    task = {"behaviour": behaviour, "question": "1+1?"}
    return Rollout(new_id(), group_id or f"{RUN_ID}-{new_id()}", f"task-{behaviour}", task)


def jobs_ever(stand: KubeApiStandIn) -> set[str]:
    return {name for kind, name in stand.creates if kind == "Job"}


def status_spans(server, rollout_ids: list[str], expected: int, timeout: float = 30) -> list[dict]:
    """The controller's status spans of the rollouts, once at least `expected` arrived."""
    listed = ", ".join(f"'{r}'" for r in rollout_ids)
    deadline = time.monotonic() + timeout
    while True:
        rows = server.sql(
            "SELECT attributes ->> 'otel_rl.rollout.id' AS rollout_id, "
            "attributes ->> 'otel_rl.attempt.id' AS attempt_id, span_id FROM spans "
            "WHERE scope_name = 'otel_rl.controller' AND name = 'otel_rl.rollout' "
            f"AND attributes ->> 'otel_rl.rollout.id' IN ({listed})"
        ).to_pylist()
        if len(rows) >= expected:
            return rows
        assert time.monotonic() < deadline, rows
        time.sleep(0.2)


def assert_once_each(stand: KubeApiStandIn, server, attempts: dict[str, list[str]]) -> None:
    """Every attempt (rollout id -> attempt ids) has one Job ever and one status span; nothing is left."""
    jobs = jobs_ever(stand)
    assert all(count == 1 for count in stand.creates.values()), stand.creates
    wanted = {names.job_name(r, n + 1) for r, ids in attempts.items() for n in range(len(ids))}
    assert wanted <= jobs  # none lost: every attempt ran as a Job
    rows = status_spans(server, list(attempts), sum(len(ids) for ids in attempts.values()))
    spans = {(row["rollout_id"], row["attempt_id"], row["span_id"]) for row in rows}
    # One span per attempt: its ids are fixed on its Job, so even an export repeated across the kill is one
    assert sorted((r, a) for r, a, _ in spans) == sorted((r, a) for r, ids in attempts.items() for a in ids)
    assert stand.call(stand.of_kind, "Job") == [] and stand.call(stand.of_kind, "Secret") == []
    assert stand.invalid == []


def test_a_new_runner_of_the_run_adopts_the_jobs_left_running(otel_rl_server, tmp_path):
    slow = [rollout("slow") for _ in range(3)]
    stuck, quick = rollout("bad-image.slow"), rollout("ok")
    with KubeApiStandIn() as stand:
        leave_jobs_behind(stand, otel_rl_server, tmp_path, [*slow, stuck, quick], running=3)
        unrecorded = {
            job["metadata"]["annotations"][names.ROLLOUT_ID]
            for job in stand.call(stand.of_kind, "Job")
            if names.RESULT not in job["metadata"]["annotations"]
        }
        before = jobs_ever(stand)

        async def main():
            controller = controller_for(stand.url, otel_rl_server.http_url, otel_rl_server.token, tmp_path)
            try:
                found = await controller.in_flight()
                results = await asyncio.wait_for(asyncio.gather(*map(controller.run_rollout, found)), 60)
                return found, results, controller.jobs_created
            finally:
                await controller.aclose()

        found, results, created = asyncio.run(main())
        # The rollouts as they were launched (id, group, task, split), read back from their Jobs alone; the
        # quick one only if the kill came before its controller recorded its result.
        expected = [*slow, stuck] + ([quick] if quick.rollout_id in unrecorded else [])
        assert sorted(found, key=lambda r: r.rollout_id) == sorted(expected, key=lambda r: r.rollout_id)
        assert [[a.status for a in r.attempts] for r in results if r.rollout in slow] == [
            [RolloutStatus.OK]
        ] * 3
        assert results[found.index(stuck)].attempts[-1].status is RolloutStatus.OK  # retried, then ran
        # New Jobs only for attempts that had none: the stuck rollout's retry, if it came after the kill.
        assert created == len(jobs_ever(stand) - before) <= 1
        assert_once_each(
            stand, otel_rl_server, {r.rollout.rollout_id: [a.attempt_id for a in r.attempts] for r in results}
        )


def test_a_resumed_launcher_trains_on_the_groups_left_running(otel_rl_server, tmp_path):
    groups = [f"{RUN_ID}-{new_id()[:16]}" for _ in range(2)]
    rollouts = [rollout("slow", group) for group in groups for _ in range(2)]
    config = TrainConfig(
        model=tmp_path,
        output_dir=tmp_path / "out",
        algorithm={"group_size": 2, "groups_per_step": 2, "max_staleness": 0},
    )
    with KubeApiStandIn() as stand:
        leave_jobs_behind(stand, otel_rl_server, tmp_path, rollouts, running=4)
        before = jobs_ever(stand)

        async def main():
            client = ServerClient(otel_rl_server.http_url, otel_rl_server.token)
            runner = controller_for(stand.url, otel_rl_server.http_url, otel_rl_server.token, tmp_path)
            # A task to launch new groups from: the 2 adopted groups fill the bound, so none may start.
            tasks = [Task("task-ok", {"behaviour": "ok", "question": "2+2?"})]
            launcher = GroupLauncher(config, client, runner, tasks, RUN_ID, OnlineState())
            try:
                launcher.start([])
                return await asyncio.wait_for(launcher.collect(0), 60)
            finally:
                await launcher.aclose()
                client.close()

        found = asyncio.run(main())
        assert sorted(found.groups) == sorted(groups) and found.stale == 0
        assert found.started_ns is not None and found.seen_through is not None
        assert jobs_ever(stand) == before  # no group launched past the bound, no Job made again
        spans = status_spans(otel_rl_server, [r.rollout_id for r in rollouts], 4)
        attempts = {row["rollout_id"]: [row["attempt_id"]] for row in spans}  # slow: one attempt each
        assert set(attempts) == {r.rollout_id for r in rollouts}
        assert_once_each(stand, otel_rl_server, attempts)


def test_a_launcher_that_cannot_list_the_jobs_left_fails_instead_of_waiting(otel_rl_server, tmp_path):
    config = TrainConfig(model=tmp_path, algorithm={"group_size": 1, "groups_per_step": 1})

    async def main():
        client = ServerClient(otel_rl_server.http_url, otel_rl_server.token)
        runner = controller_for(stand.url, otel_rl_server.http_url, otel_rl_server.token, tmp_path)
        launcher = GroupLauncher(config, client, runner, [], RUN_ID, OnlineState())
        try:
            launcher.start([])
            await asyncio.wait_for(launcher.collect(0), 30)
        finally:
            await launcher.aclose()
            client.close()

    with KubeApiStandIn() as stand:
        stand.faults.append(Fault("GET", "/jobs?", 403))  # not retried: RBAC without `list jobs`
        with pytest.raises(Exception, match="403"):
            asyncio.run(main())


def job(rollout: Rollout, attempt: int, result: str | None = None, started_ns: int = 1) -> dict:
    """A Job as the controller renders it, reduced to what adoption reads."""
    annotations = {
        names.ROLLOUT_ID: rollout.rollout_id,
        names.GROUP_ID: rollout.group_id,
        names.TASK_ID: rollout.task_id,
        names.SPLIT: rollout.split,
        names.STARTED_NS: str(started_ns),
    }
    if result is not None:
        annotations[names.RESULT] = json.dumps(
            {"status": result, "exit_code": None, "duration_s": 1, "reason": ""}
        )
    env = [{"name": "OTEL_RL_TASK", "value": json.dumps(dict(rollout.task))}]
    return {
        "metadata": {
            "name": names.job_name(rollout.rollout_id, attempt),
            "labels": {names.ATTEMPT: str(attempt)},
            "annotations": annotations,
        },
        "spec": {"template": {"spec": {"containers": [{"name": "harness", "env": env}]}}},
    }


def test_which_rollouts_are_unfinished():
    running, retry, done, exhausted, broken = (rollout("ok") for _ in range(5))
    jobs = [
        job(running, 1, started_ns=5),  # no result yet: watched on
        job(retry, 1, "infra_error", started_ns=3),  # retried with an attempt left: the next one starts
        job(done, 1, "infra_error"),
        job(done, 2, "ok"),  # final: returned, or only its deletion was lost
        job(exhausted, 1, "timeout"),
        job(exhausted, 2, "timeout"),  # retried, but max_attempts is 2
        {**job(broken, 1), "spec": {}},  # no harness container to read the task from: left alone
        {"metadata": {"name": "someone-elses", "labels": {}}},
    ]
    assert unfinished_rollouts(jobs, max_attempts=2) == [retry, running]
    assert unfinished_rollouts(jobs[:2], max_attempts=1) == [running]  # one attempt only: a result is final


def test_which_groups_a_resumed_launcher_adopts():
    mine, trained, finished = f"{RUN_ID}-a", f"{RUN_ID}-b", f"{RUN_ID}-c"
    found = [
        rollout("ok", mine),
        rollout("ok", mine),
        rollout("ok", trained),
        rollout("ok", finished),
        rollout("ok", "another-run-d"),
        Rollout(new_id(), f"{RUN_ID}-eval-e", "task", {}, "val"),  # the evaluator's: not a training group
    ]
    assert adoptable_groups(found, RUN_ID, {trained, finished}) == {mine: found[:2]}
