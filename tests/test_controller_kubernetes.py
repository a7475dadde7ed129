"""Rollouts as Kubernetes Jobs, against an API server stand-in speaking the real protocol (tests/kube_api.py).

The controller is the real one with the official client; the otel-rl server is real (rollout keys, the
controller's spans in the store). Every object the controller sends is checked against the OpenAPI schema.
"""

import asyncio
import json
import time
from pathlib import Path

import pytest
from kube_api import Fault, KubeApiStandIn
from kube_child import POD_SERVER_URL, RUN_ID, TEMPLATE, controller_for, leave_jobs_behind

from otel_rl import attributes as attr
from otel_rl.controller import Rollout, RolloutResult, RolloutStatus, new_id
from otel_rl.controller.kubernetes import names

OK, ERROR, TIMEOUT, INFRA = (
    RolloutStatus.OK,
    RolloutStatus.ERROR,
    RolloutStatus.TIMEOUT,
    RolloutStatus.INFRA_ERROR,
)


def rollout(behaviour: str) -> Rollout:
    return Rollout(
        new_id(), f"{RUN_ID}-{new_id()}", f"task-{behaviour}", {"behaviour": behaviour, "question": "1+1?"}
    )


def run_all(
    stand: KubeApiStandIn, server, tmp_path: Path, rollouts: list[Rollout], during=None, **settings
) -> tuple[list[RolloutResult], object]:
    async def main():
        controller = controller_for(stand.url, server.http_url, server.token, tmp_path / "logs", **settings)
        try:
            running = asyncio.gather(*(controller.run_rollout(r) for r in rollouts))
            if during is not None:
                await during(controller)
            return await asyncio.wait_for(running, 60), controller
        finally:
            await controller.aclose()

    return asyncio.run(main())


def spans_of(server, rollout_id: str, expected: int, timeout: float = 30) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        rows = server.sql(
            "SELECT attributes ->> 'otel_rl.attempt.id' AS attempt_id, trace_id, span_id, "
            "attributes ->> 'otel_rl.rollout.status' AS status FROM spans "
            "WHERE scope_name = 'otel_rl.controller' "
            f"AND name = 'otel_rl.rollout' AND attributes ->> 'otel_rl.rollout.id' = '{rollout_id}' "
            "ORDER BY start_time_unix_nano"
        ).to_pylist()
        if len(rows) >= expected:
            return rows
        assert time.monotonic() < deadline, f"rollout {rollout_id}: {rows}"
        time.sleep(0.2)


def created_jobs(stand: KubeApiStandIn) -> list[dict]:
    return [
        obj
        for _, kind, event, obj in stand.call(lambda: list(stand.history))
        if kind == "Job" and event == "ADDED"
    ]


def assert_clean(stand: KubeApiStandIn) -> None:
    """Nothing left behind, every manifest valid, no attempt's Job created twice."""
    assert stand.call(stand.of_kind, "Secret") == []
    assert stand.call(stand.of_kind, "Job") == []
    assert stand.invalid == []
    assert all(count == 1 for count in stand.creates.values()), stand.creates


@pytest.fixture(scope="module")
def statuses(otel_rl_server, tmp_path_factory):
    """One run of every behaviour at once: the shared scene of the status tests."""
    behaviours = ["ok", "fail", "sleep", "bad-image.ok", "evicted", "oom", "unschedulable"]
    rollouts = {b: rollout(b) for b in behaviours}
    with KubeApiStandIn() as stand:
        results, _ = run_all(stand, otel_rl_server, tmp_path_factory.mktemp("k8s"), list(rollouts.values()))
        yield stand, {b: r for b, r in zip(behaviours, results, strict=True)}


@pytest.mark.parametrize(
    ("behaviour", "expected"),
    [
        ("ok", [(OK, 0)]),
        ("fail", [(ERROR, 1)]),  # the harness's own failure: recorded, not retried
        ("sleep", [(TIMEOUT, None), (TIMEOUT, None)]),  # activeDeadlineSeconds → DeadlineExceeded
        ("bad-image.ok", [(INFRA, None), (OK, 0)]),  # image pull failure, retried as a new attempt
        ("evicted", [(INFRA, None), (INFRA, None)]),  # bounded by max_attempts
        ("oom", [(INFRA, 137), (INFRA, 137)]),
        ("unschedulable", [(INFRA, None), (INFRA, None)]),  # pending past pending_timeout_s
    ],
)
def test_status_from_the_cluster(statuses, otel_rl_server, behaviour, expected):
    stand, results = statuses
    result = results[behaviour]
    assert [(a.status, a.exit_code) for a in result.attempts] == expected
    rows = spans_of(otel_rl_server, result.rollout.rollout_id, len(expected))
    assert [row["attempt_id"] for row in rows] == [a.attempt_id for a in result.attempts]
    assert [row["status"] for row in rows] == [s.value for s, _ in expected]
    assert [row["trace_id"] for row in rows] == [a.trace_id for a in result.attempts]


def test_a_failure_the_pod_watch_has_not_shown_yet_is_read_from_the_api(otel_rl_server, tmp_path):
    # The Jobs' and the Pods' watches are two streams: the Job's failure may come first (seen under load).
    # The harness's own failure is still an error, not an infra error retried.
    with KubeApiStandIn() as stand:
        stand.held_back.add("Pod")
        [result], _ = run_all(stand, otel_rl_server, tmp_path, [rollout("fail")])
    assert [(a.status, a.exit_code) for a in result.attempts] == [(ERROR, 1)]


def test_each_attempts_key_is_revoked_when_its_attempt_ends(statuses, otel_rl_server):
    _, results = statuses
    for result in results.values():
        revoked = otel_rl_server.sql(
            "SELECT k.attempt_id, r.reason FROM rollout_keys k"
            " JOIN rollout_key_revocations r USING (key_hash)"
            f" WHERE k.rollout_id = '{result.rollout.rollout_id}' ORDER BY r.revoked_at"
        ).to_pylist()
        assert revoked == [
            {"attempt_id": a.attempt_id, "reason": f"attempt {a.attempt_id} ended"} for a in result.attempts
        ]


def test_jobs_carry_the_forced_fields_and_the_contract(statuses):
    stand, results = statuses
    assert_clean(stand)
    stand.call(
        stand._validate, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {}, "spec": {"bogus": 1}}
    )
    assert len(stand.invalid) == 1 and "bogus" in stand.invalid.pop()  # the schema check can fail
    jobs = {job["metadata"]["name"]: job for job in created_jobs(stand)}
    result = results["bad-image.ok"]
    for number, attempt in enumerate(result.attempts, 1):
        job = jobs[names.job_name(result.rollout.rollout_id, number)]
        spec, pod = job["spec"], job["spec"]["template"]["spec"]
        assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"]) == (
            0,
            3,
            3600,
        )
        assert pod["restartPolicy"] == "Never"
        labels = job["metadata"]["labels"]
        assert labels[names.RUN] == RUN_ID and labels[names.ATTEMPT] == str(number)
        assert (
            labels[names.ROLLOUT] == result.rollout.rollout_id and labels[names.TASK] == "task-bad-image.ok"
        )
        assert job["spec"]["template"]["metadata"]["labels"][names.ROLLOUT] == result.rollout.rollout_id
        assert job["metadata"]["annotations"][names.ATTEMPT_ID] == attempt.attempt_id
        harness, sidecar = pod["containers"]
        assert harness["command"] == [
            "python",
            "-m",
            "harness",
            json.dumps(result.rollout.task, sort_keys=True, separators=(",", ":")),
        ]
        assert sidecar["command"] == ["sleep", "infinity"]
        for container in (harness, sidecar):
            env = {e["name"]: e for e in container["env"]}
            assert env["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == job["metadata"]["name"]
            assert "value" not in env["OPENAI_API_KEY"]  # the key is never in the Job itself
            assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == POD_SERVER_URL
        assert {e["name"]: e.get("value") for e in harness["env"]}["HARNESS_MODE"] == f"attempt-{number}"
    # What the harness of the successful attempt saw, Secret values resolved by the "kubelet".
    [env] = [
        env for pod, env in stand.envs.items() if pod.startswith(names.job_name(result.rollout.rollout_id, 2))
    ]
    attempt = result.attempts[1]
    assert env["OPENAI_BASE_URL"] == f"{POD_SERVER_URL}/v1" and env["ANTHROPIC_BASE_URL"] == POD_SERVER_URL
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
    assert env["TRACEPARENT"].split("-")[1] == attempt.trace_id
    assert f"{attr.ATTEMPT_ID}={attempt.attempt_id}" in env["OTEL_RESOURCE_ATTRIBUTES"]
    assert env["OPENAI_API_KEY"] == env["ANTHROPIC_API_KEY"] != ""
    assert env["OTEL_EXPORTER_OTLP_HEADERS"] == f"authorization=Bearer%20{env['OPENAI_API_KEY']}"
    assert env["HARNESS_LEVEL"] == "debug"
    # One Secret per attempt that got to run, all gone now.
    started = sum(len(r.attempts) for r in results.values())
    assert len(stand.secrets_ever) == started
    assert attempt.log_path.read_text().startswith("harness output of ")


def test_api_errors_are_retried_and_lost_answers_do_not_duplicate(otel_rl_server, tmp_path):
    rollouts = [rollout("ok") for _ in range(4)]
    with KubeApiStandIn() as stand:
        stand.faults += [
            Fault("POST", "/jobs", 429, times=2, retry_after="1"),
            Fault("POST", "/jobs", 500, times=1, after=True),  # created, but the answer is lost → 409 → adopt
            Fault("POST", "/secrets", 503, times=2),
            Fault("PATCH", "/jobs/", 500, times=2),
            Fault("GET", "/pods?", 500, times=1),
            Fault("DELETE", "/secrets/", 500, times=1),
        ]
        started = time.monotonic()
        results, _ = run_all(stand, otel_rl_server, tmp_path, rollouts)
        assert time.monotonic() - started >= 1.0  # Retry-After was honoured
        assert [[a.status for a in r.attempts] for r in results] == [[OK]] * 4
        assert sum(stand.conflicts.values()) == 1
        assert all(f.times == 0 for f in stand.faults)
        assert_clean(stand)


def test_dropped_watches_and_410_gone_relist(otel_rl_server, tmp_path):
    rollouts = [rollout("slow") for _ in range(3)]

    async def disturb(controller):
        deadline = time.monotonic() + 30
        while not stand.call(stand.open_watches) or len(stand.call(stand.of_kind, "Job")) < len(rollouts):
            assert time.monotonic() < deadline, "the controller never watched its jobs"
            await asyncio.sleep(0.05)
        stand.call(stand.compact)  # the versions the watches hold are now too old: 410 on reconnect
        stand.call(stand.drop_watches)

    with KubeApiStandIn() as stand:
        # relist_s 30: the run (~2 s) ends long before a periodic relist, so only the drop's relist saves it
        results, controller = run_all(stand, otel_rl_server, tmp_path, rollouts, during=disturb, relist_s=30)
        assert [[a.status for a in r.attempts] for r in results] == [[OK]] * 3
        assert controller._view is None  # closed
        assert_clean(stand)


def test_a_killed_controller_is_adopted_without_duplicates(otel_rl_server, tmp_path):
    rollouts = [rollout("slow") for _ in range(4)] + [rollout("bad-image.slow"), rollout("ok")]
    with KubeApiStandIn() as stand:
        # Killed while the slow ones run and the bad image's first attempt is stuck or being retried.
        leave_jobs_behind(stand, otel_rl_server, tmp_path, rollouts, running=4)
        before = dict(stand.creates)
        assert any(kind == "Job" for kind, _ in before)
        results, _ = run_all(stand, otel_rl_server, tmp_path, rollouts)
        statuses = [[a.status for a in r.attempts] for r in results]
        assert statuses[:4] + statuses[5:] == [[OK]] * 5
        # The stuck first attempt: an image pull failure, or, if the restart took longer than the Job's
        # deadline (a loaded machine), that deadline; retried either way.
        assert statuses[4] in ([INFRA, OK], [TIMEOUT, OK])
        assert_clean(stand)  # each attempt's Job created once, by the first or the second controller
        for result in results:  # every attempt recorded, the ones the first controller started included
            rows = spans_of(otel_rl_server, result.rollout.rollout_id, len(result.attempts))
            assert {row["attempt_id"] for row in rows} == {a.attempt_id for a in result.attempts}


def test_a_cancelled_rollout_ends_its_job(otel_rl_server, tmp_path):
    sleeper = rollout("sleep")

    async def main():
        controller = controller_for(
            stand.url, otel_rl_server.http_url, otel_rl_server.token, tmp_path, timeout_s=60
        )
        running = asyncio.create_task(controller.run_rollout(sleeper))
        while not [p for p in stand.call(stand.of_kind, "Pod") if p["status"].get("phase") == "Running"]:
            await asyncio.sleep(0.05)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        await controller.aclose()

    with KubeApiStandIn() as stand:
        asyncio.run(main())
        assert_clean(stand)  # the Job, its pod and its Secret are gone
        assert stand.call(stand.of_kind, "Pod") == []
    [row] = spans_of(otel_rl_server, sleeper.rollout_id, 1)
    assert row["status"] == "infra_error"


def test_a_wait_cancelled_as_its_job_changes_is_cancelled():
    """The race behind a cancelled rollout whose Job kept running: its pod's change and the cancel in one
    tick. Python 3.11's asyncio.wait_for returns the finished wait then, and the cancel is lost."""
    from otel_rl.controller.kubernetes.cluster import ClusterView

    async def main():
        view = ClusterView(api=None, selector="otel-rl/run=r", relist_s=60)  # changed() reads no API
        waiting = asyncio.create_task(view.changed("job-1", 30))
        await asyncio.sleep(0)  # it waits
        view.put_job({"metadata": {"name": "job-1", "resourceVersion": "1"}})  # wakes it
        waiting.cancel()  # in the same tick
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(main())


def test_the_template_is_checked(tmp_path):
    from otel_rl.controller.kubernetes.render import TemplateError, load_template

    base = TEMPLATE.read_text()
    cases = {
        "command": base.replace(
            '          image: "registry', '          command: [x]\n          image: "registry'
        ),
        "OPENAI_API_KEY": base.replace("name: HARNESS_MODE", "name: OPENAI_API_KEY"),
        "kind: Job": base.replace("kind: Job", "kind: Pod"),
        "not valid YAML": base.replace(
            '"registry.local/harness:{{ task.behaviour }}"', "{{ task.behaviour }}: ["
        ),
    }
    for needle, text in cases.items():
        path = tmp_path / "job.yaml"
        path.write_text(text)
        with pytest.raises(TemplateError, match=needle):
            load_template(path)


def test_task_values_cannot_change_the_manifest():
    from otel_rl.controller.kubernetes.render import Attempt, TemplateError, load_template, render_job

    hostile = 'x"\n  spec: {hostNetwork: true}\n{{ 7 * 7 }}'
    task = {"behaviour": "ok", "question": hostile}
    attempt = Attempt("r1", 1, "a1", "g1", "t1", "train", RUN_ID, task, f"00-{'1' * 32}-{'2' * 16}-01", 1)
    options = dict(
        namespace="ns",
        command=["h"],
        timeout_s=9.5,
        ttl_seconds_after_finished=60,
        server_url="http://s",
        user_env={},
    )
    job = render_job(load_template(TEMPLATE), attempt, **options)
    assert job["metadata"]["annotations"]["example.com/question"] == hostile  # rendered once, kept as text
    assert "hostNetwork" not in job["spec"]["template"]["spec"]
    assert job["spec"]["activeDeadlineSeconds"] == 10 and job["spec"]["suspend"] is True
    with pytest.raises(TemplateError, match="question"):
        render_job(
            load_template(TEMPLATE), Attempt(**{**attempt.__dict__, "task": {"behaviour": "ok"}}), **options
        )


def test_node_loss_and_signals_from_the_objects_alone():
    from datetime import UTC, datetime

    from otel_rl.controller.kubernetes.status import ending

    now = datetime.now(UTC)
    failed = {
        "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}
    }
    assert ending(failed, [], now=now, pending_timeout_s=1).status is INFRA  # the pod went with its node
    tainted = {
        "status": {
            "phase": "Failed",
            "conditions": [
                {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}
            ],
        }
    }
    found = ending({"status": {}}, [tainted], now=now, pending_timeout_s=1)
    assert (found.status, found.reason) == (INFRA, "DeletionByTaintManager")
    killed = {
        "spec": {"containers": [{"name": "h"}]},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"name": "h", "state": {"terminated": {"exitCode": 143, "reason": "Error"}}}
            ],
        },
    }
    assert ending(failed, [killed], now=now, pending_timeout_s=1).status is RolloutStatus.CRASHED
    assert ending({"status": {"active": 1}}, [], now=now, pending_timeout_s=1) is None
