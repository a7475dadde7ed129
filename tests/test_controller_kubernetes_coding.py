"""Coding rollouts on the Kubernetes backend, against the API server stand-in (tests/kube_api.py) and a real
`otel-rl serve`: the rendered Job runs the harness inside the local backend's sandbox launcher
(kubernetes/pod.py) with what bwrap needs and nothing of the grader's side; with image behaviour `run` the
stand-in's kubelet executes that very pod command as a local process, with real bwrap, and the grader on
the controller's side posts the reward."""

import asyncio
import base64
import io
import json
import sys
import sysconfig
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from coding_tasks import humaneval_task_file
from fake_vllm import MODEL, FakeVLLM
from kube_api import KubeApiStandIn
from kube_child import RUN_ID, controller_for
from otel_rl_server import ServerProcess
from test_coding_rollout import HARNESS, LIMITS, reply, wait_rows

from otel_rl import attributes as attr
from otel_rl.coding import humaneval, sandbox
from otel_rl.coding.tasks import TaskSet, load_tasks
from otel_rl.controller import Rollout, RolloutResult, RolloutStatus, new_id
from otel_rl.controller.coding import CodingLauncher
from otel_rl.controller.kubernetes import coding as kube_coding
from otel_rl.controller.kubernetes import names
from otel_rl.train.server_client import ServerClient

ROOT = Path(__file__).parents[1]
POLICY = ROOT / "examples" / "kubernetes" / "networkpolicy.yaml"
# The "image" the stand-in's kubelet runs a pod on is this machine as the pod's user (uid 1000) sees it: the
# system Python with the project and its packages on PYTHONPATH (this venv's interpreter may live where uid
# 1000 cannot reach, e.g. under /root); the packages are bound into the sandbox for the harness.
IMAGE_PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
SITE = sysconfig.get_paths()["purelib"]
IMAGE_ENV = {"PYTHONPATH": f"{SITE}:{ROOT}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A real `otel-rl serve` whose gateway answers from a stand-in vLLM (test_coding_rollout's replies)."""
    workdir = tmp_path_factory.mktemp("kubernetes_coding")
    with FakeVLLM(reply, model=MODEL) as upstream:
        flags = ("--vllm", upstream.base_url)
        process = ServerProcess(workdir / "otel_rl.duckdb", workdir, flags=flags).start()
        yield process
        process.stop()


def coding_for(server: ServerProcess, task_set: TaskSet) -> kube_coding.KubernetesCoding:
    client = ServerClient(server.http_url, server.token)
    launcher = CodingLauncher(
        task_set, admin_token=server.token, post_reward=client.post_reward, limits=LIMITS,
        grader_limits=LIMITS, binds=[HARNESS.parent, Path(SITE)],
    )  # fmt: skip
    return kube_coding.KubernetesCoding(launcher, admin_token=server.token, python=IMAGE_PYTHON)


def run(
    stand: KubeApiStandIn, server: ServerProcess, tmp_path: Path, rollouts: list[Rollout], **settings: Any
) -> list[RolloutResult]:
    async def main() -> list[RolloutResult]:
        controller = controller_for(stand.url, server.http_url, server.token, tmp_path / "logs", **settings)
        try:
            return await asyncio.wait_for(asyncio.gather(*(controller.run_rollout(r) for r in rollouts)), 120)
        finally:
            await controller.aclose()

    return asyncio.run(main())


def added(stand: KubeApiStandIn, kind: str) -> list[dict]:
    return [
        obj for _, k, event, obj in stand.call(lambda: list(stand.history)) if k == kind and event == "ADDED"
    ]


def controller_span(server: ServerProcess, rollout_id: str) -> dict:
    rows = wait_rows(
        server,
        "SELECT attributes FROM spans WHERE scope_name = 'otel_rl.controller' AND name = 'otel_rl.rollout' "
        f"AND attributes ->> 'otel_rl.rollout.id' = '{rollout_id}' ORDER BY start_time_unix_nano",
        1,
    )
    found = rows[-1]["attributes"]
    return json.loads(found) if isinstance(found, str) else found


def test_a_coding_job_runs_the_sandbox_launcher_with_nothing_of_the_graders_side(
    server: ServerProcess, tmp_path: Path
) -> None:
    task_set = load_tasks(humaneval_task_file(tmp_path, count=1))
    task = task_set.tasks[0]
    harness = [IMAGE_PYTHON, str(HARNESS), "{task}"]
    rollout = Rollout(
        new_id(),
        f"{RUN_ID}-{new_id()}",
        task.instance_id,
        {"behaviour": "ok", "question": "q", "answer": "x"},
    )
    # A task that holds the grader's side is refused before any Job exists: an infrastructure error.
    hostile = Rollout(
        new_id(), f"{RUN_ID}-{new_id()}", task.instance_id, {**rollout.task, "patch": task.patch}
    )
    with KubeApiStandIn() as stand:
        coding = coding_for(server, task_set)
        [result, refused] = run(
            stand, server, tmp_path, [rollout, hostile], coding=coding, command=harness, max_attempts=1
        )
        [job], [secret] = added(stand, "Job"), added(stand, "Secret")
        envs = stand.call(lambda: dict(stand.envs))
        assert stand.invalid == []  # the Job with its securityContext, volumes and Secret is valid for 1.32
    # An `ok` pod of the stand-in runs nothing: no report, so no diff to grade, never a reward.
    assert [a.status for a in result.attempts] == [RolloutStatus.INFRA_ERROR]
    span = controller_span(server, rollout.rollout_id)
    assert "no report" in span[attr.GRADE_ERROR] and attr.GRADE_REWARD not in span
    assert [a.status for a in refused.attempts] == [RolloutStatus.INFRA_ERROR]
    assert "grader-side fields" in controller_span(server, hostile.rollout_id)["otel_rl.kubernetes.reason"]
    assert span[attr.SANDBOX_MODE] == "bubblewrap" and span[attr.CODING_INSTANCE] == task.instance_id
    assert span[attr.SANDBOX_LIMITS + "wall_seconds"] == LIMITS.wall_seconds

    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    command = container["command"]
    split = command.index("--")
    assert command[:3] == [IMAGE_PYTHON, "-m", "otel_rl.controller.kubernetes.pod"]
    pairs = list(zip(command[3:split:2], command[4:split:2], strict=True))
    options = dict(pairs)
    assert options["--snapshot"] == f"{kube_coding.MOUNT}/{kube_coding.SNAPSHOT_KEY}"
    assert options["--report"] == container["terminationMessagePath"] == kube_coding.REPORT
    assert json.loads(options["--limits"]) == LIMITS.model_dump() and options["--mode"] == "bubblewrap"
    assert [value for flag, value in pairs if flag == "--bind"] == [str(HARNESS.parent.resolve()), SITE]
    agent_side = json.loads(command[split + 3])  # the harness's own argv after the launcher's, {task} filled
    assert command[split + 1 : split + 3] == harness[:2]
    assert set(agent_side) == {"behaviour", "question", "answer", "instance_id", "repo", "problem_statement"}
    # What bwrap needs, forced; the Job may not talk to the API or see services.
    assert pod["hostUsers"] is False and pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False
    context = container["securityContext"]
    assert context["procMount"] == "Unmasked" and context["seccompProfile"] == {"type": "Unconfined"}
    assert context["appArmorProfile"] == {"type": "Unconfined"} and context["runAsNonRoot"] is True
    assert context["capabilities"] == {"drop": ["ALL"]} and context["allowPrivilegeEscalation"] is False
    [volume] = [v for v in pod["volumes"] if v["name"] == container["volumeMounts"][0]["name"]]
    assert volume["secret"]["items"] == [{"key": kube_coding.SNAPSHOT_KEY, "path": kube_coding.SNAPSHOT_KEY}]
    # Nothing of the grader's side anywhere in the Job, the pod's environment or the snapshot it mounts.
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(secret["data"][kube_coding.SNAPSHOT_KEY]))) as tar:
        snapshot = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}
    assert "solution.py" in snapshot and not any(name.startswith(".git") for name in snapshot)
    [env] = envs.values()
    for text in (json.dumps(job), json.dumps(env), *snapshot.values()):
        assert server.token not in text
        assert task.test_patch.strip() not in text and "def check(candidate)" not in text
        assert task.patch.strip() not in text
    assert set(secret["data"]) == {"OTEL_EXPORTER_OTLP_HEADERS", "OPENAI_API_KEY", "ANTHROPIC_API_KEY",
                                   kube_coding.SNAPSHOT_KEY}  # fmt: skip
    # The NetworkPolicy selects the pod by the label the controller forces on it.
    policy = yaml.safe_load(POLICY.read_text())
    [expression] = policy["spec"]["podSelector"]["matchExpressions"]
    assert expression == {"key": names.ROLLOUT, "operator": "Exists"}
    assert names.ROLLOUT in job["spec"]["template"]["metadata"]["labels"]


def test_the_rendered_pod_command_runs_under_real_bwrap_and_the_grader_outside_rewards_it(
    server: ServerProcess, tmp_path: Path
) -> None:
    task_set = load_tasks(humaneval_task_file(tmp_path, count=1))
    task = task_set.tasks[0]
    # No scan of every readable file (`visible`): the project's packages, bound in for the harness, are
    # gigabytes here; test_coding_rollout scans the same sandbox (sandbox.bwrap_argv) on the local backend.
    host_paths = [str(task_set.path), str(server.db), str(server.workdir)]
    probes = {"model": MODEL, "ports": [], "outside": "127.0.0.2", "host_paths": host_paths, "scan": False}
    harness = [IMAGE_PYTHON, str(HARNESS), json.dumps(probes)]
    rollouts = {
        answer: Rollout(
            new_id(),
            f"{RUN_ID}-{new_id()}",
            task.instance_id,
            {"behaviour": "run", "question": "q", "answer": answer},
        )
        for answer in ("right", "wrong")
    }
    with KubeApiStandIn() as stand:
        coding = coding_for(server, task_set)
        results = run(
            stand, server, tmp_path, list(rollouts.values()), coding=coding, command=harness, max_attempts=1,
            pod_server_url=server.http_url, timeout_s=120, env=IMAGE_ENV,
        )  # fmt: skip
        assert stand.invalid == []
    assert [[a.status for a in r.attempts] for r in results] == [[RolloutStatus.OK]] * 2
    rows = wait_rows(
        server,
        "SELECT rollout_id, value, explanation FROM rewards WHERE source = 'grader' AND rollout_id IN "
        f"('{rollouts['right'].rollout_id}', '{rollouts['wrong'].rollout_id}')",
        2,
    )
    by = {row["rollout_id"]: row for row in rows}
    for (answer, rollout), result in zip(rollouts.items(), results, strict=True):
        expected = 1.0 if answer == "right" else 0.0
        assert by[rollout.rollout_id]["value"] == expected
        tests = json.loads(by[rollout.rollout_id]["explanation"])["tests"]
        assert tests == {humaneval.HIDDEN_TEST_ID: "passed" if expected else "failed"}
        span = controller_span(server, rollout.rollout_id)
        assert span[attr.GRADE_OUTCOME] == "graded" and span[attr.GRADE_REWARD] == expected
        # What the harness saw inside the pod's sandbox (its report is the log's first line).
        report = json.loads(result.attempts[-1].log_path.read_text().splitlines()[0])
        assert report["cwd"] == "/workspace" and len(report["git_log"]) == 1  # no history to mine
        assert not any(report["host_paths"].values()), report["host_paths"]
    # The harness's own spans carry the sandbox's mode and limits on their resource, as on the local backend.
    resource = wait_rows(
        server,
        "SELECT resource_attributes ->> 'otel_rl.sandbox.mode' AS mode, "
        "resource_attributes ->> 'otel_rl.sandbox.limits.cpu_seconds' AS cpu FROM spans "
        "WHERE name = 'self_check' AND resource_attributes ->> 'otel_rl.rollout.id' = "
        f"'{rollouts['right'].rollout_id}'",
        1,
    )
    assert resource == [{"mode": "bubblewrap", "cpu": str(LIMITS.cpu_seconds)}]


def test_a_pod_whose_sandbox_cannot_start_or_hits_its_wall_clock_is_never_graded(
    server: ServerProcess, tmp_path: Path
) -> None:
    task_set = load_tasks(humaneval_task_file(tmp_path, count=1))
    task = task_set.tasks[0]
    client = ServerClient(server.http_url, server.token)
    harness = [IMAGE_PYTHON, str(HARNESS), json.dumps({"model": MODEL, "ports": [], "outside": "127.0.0.2"})]

    def attempt(answer: str, limits: sandbox.Limits, binds: list[Path]) -> tuple[Rollout, RolloutResult]:
        launcher = CodingLauncher(
            task_set, admin_token=server.token, post_reward=client.post_reward, limits=limits, binds=binds
        )
        coding = kube_coding.KubernetesCoding(launcher, admin_token=server.token, python=IMAGE_PYTHON)
        rollout = Rollout(
            new_id(),
            f"{RUN_ID}-{new_id()}",
            task.instance_id,
            {"behaviour": "run", "question": "q", "answer": answer},
        )
        with KubeApiStandIn() as stand:
            [result] = run(
                stand, server, tmp_path, [rollout], coding=coding, command=harness, max_attempts=1,
                pod_server_url=server.http_url, timeout_s=120, env=IMAGE_ENV,
            )  # fmt: skip
        return rollout, result

    # bwrap cannot bind a folder the image does not have: the harness never runs, an infrastructure error
    missing = [HARNESS.parent, Path(SITE), tmp_path / "not-in-the-image"]
    rollout, result = attempt("right", LIMITS, missing)
    assert [(a.status, a.exit_code) for a in result.attempts] == [(RolloutStatus.INFRA_ERROR, 125)]
    span = controller_span(server, rollout.rollout_id)
    assert span[attr.GRADE_OUTCOME] == "not_graded" and "did not start" in span[attr.GRADE_ERROR]
    # the wall clock takes the whole sandbox (the harness and its `sleep 600`): timed out, truncated
    rollout_hung, result = attempt("hang", sandbox.Limits(wall_seconds=3), [HARNESS.parent, Path(SITE)])
    assert [(a.status, a.exit_code) for a in result.attempts] == [(RolloutStatus.TIMEOUT, 124)]
    assert result.attempts[0].duration_s < 60
    span = controller_span(server, rollout_hung.rollout_id)
    assert span[attr.ROLLOUT_TRUNCATED] == "time" and span[attr.GRADE_OUTCOME] == "not_graded"
    ids = f"'{rollout.rollout_id}', '{rollout_hung.rollout_id}'"
    assert server.scalar(f"SELECT count(*) FROM rewards WHERE rollout_id IN ({ids})") == 0
