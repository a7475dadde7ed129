"""Rollouts as Kubernetes Jobs: one Job (and one Secret with its key) per attempt, watched to its end.

The state of a run lives in the cluster, on its Jobs: labels (run, rollout, attempt number) find them, and
annotations hold each attempt's id, trace context, start time and, once its span was exported, its result.
A Job's name is fixed by rollout and attempt number, so a restarted controller asked for the same rollouts
adopts the Jobs it finds — a finished attempt is read back, a running one watched on — instead of starting
them again; `in_flight` tells a restarted online loop which rollouts those are (adopt.py). A rollout's
Jobs are deleted when the rollout is final; each attempt's Secret when it ends.
"""

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Status, StatusCode

from otel_rl import attributes as attr
from otel_rl.controller.environment import validate_user_env
from otel_rl.controller.kubernetes import names
from otel_rl.controller.kubernetes.adopt import unfinished_rollouts
from otel_rl.controller.kubernetes.api import KubernetesApi
from otel_rl.controller.kubernetes.cluster import ClusterView
from otel_rl.controller.kubernetes.coding import KubernetesCoding
from otel_rl.controller.kubernetes.ids import FixedIds, random_traceparent, split_traceparent
from otel_rl.controller.kubernetes.rate import RateLimit
from otel_rl.controller.kubernetes.render import Attempt, load_template, render_job, render_secret
from otel_rl.controller.kubernetes.settings import KubernetesSettings
from otel_rl.controller.kubernetes.status import Ending, ending
from otel_rl.controller.local import ControllerSettings, KeyIssuer, KeyRevoker, revoke_quietly
from otel_rl.controller.rollouts import RETRIED, AttemptResult, Rollout, RolloutResult, RolloutStatus, new_id

CHECK_S = 5.0  # how often a waiting attempt re-reads its state without an event (pending timeouts)
MAX_LOG_BYTES = 1 << 20  # of a pod's log copied to log_dir
FLUSH_MS = 30_000  # the longest an attempt waits for its span's export
ABANDON_S = 10.0  # how long a cancelled attempt waits for its Job's deletion


@dataclass(frozen=True)
class _Record:
    """An attempt's result as kept on its Job (the RESULT annotation)."""

    status: RolloutStatus
    exit_code: int | None
    duration_s: float
    reason: str
    attributes: dict[str, Any] = field(default_factory=dict)  # the span's (the sandbox's, the grader's)

    def annotation(self) -> str:
        return json.dumps(
            {
                "status": self.status.value,
                "exit_code": self.exit_code,
                "duration_s": self.duration_s,
                "reason": self.reason[:1000],
            }
        )

    @classmethod
    def parse(cls, text: str) -> "_Record":
        data = json.loads(text)
        return cls(
            RolloutStatus(data["status"]), data["exit_code"], float(data["duration_s"]), data["reason"]
        )


class KubernetesController:
    """Runs rollouts as Jobs from a template and records each attempt's status as an OTel span."""

    def __init__(
        self,
        settings: ControllerSettings,
        kubernetes: KubernetesSettings,
        *,
        otlp_endpoint: str,
        openai_base_url: str,
        token: str,
        issue_key: KeyIssuer,
        revoke_key: KeyRevoker | None = None,
        run_id: str = "",
        api: KubernetesApi | None = None,
        coding: KubernetesCoding | None = None,
    ) -> None:
        validate_user_env(settings.env)
        if settings.preload or settings.nice:
            # A pod's image and resources take their place: the template's requests, limits, priorityClass.
            raise ValueError("online.preload and online.nice apply to local harness processes, not to Jobs")
        self.settings = settings
        self.kubernetes = kubernetes
        self.template = load_template(kubernetes.template)
        self.run_id = run_id or "default"
        self._server_url = kubernetes.server_url or otlp_endpoint.rstrip("/")
        del openai_base_url  # pods reach the gateway at server_url/v1, as they reach the collector
        self._issue_key = issue_key
        self._revoke_key = revoke_key  # as the local controller's
        self._ids = FixedIds()
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": "otel-rl-controller"}), id_generator=self._ids
        )
        exporter = OTLPSpanExporter(
            endpoint=f"{otlp_endpoint.rstrip('/')}/v1/traces", headers={"authorization": f"Bearer {token}"}
        )
        self._provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=100))
        self._tracer = self._provider.get_tracer(attr.CONTROLLER_SCOPE)
        self._api = api
        self._coding = coding  # coding tasks: the harness sandboxed in its pod, graded here (coding.py)
        self._view: ClusterView | None = None
        self._started: asyncio.Lock | None = None
        self._slots: asyncio.Semaphore | None = None
        self._rate: RateLimit | None = None
        self.jobs_created = 0
        settings.log_dir.mkdir(parents=True, exist_ok=True)

    async def _start(self) -> ClusterView:
        # Lazily, in the running event loop: its locks, the HTTP session and the watches belong to it.
        if self._started is None:
            self._started = asyncio.Lock()
        async with self._started:
            if self._view is None:
                if self._api is None:
                    self._api = await KubernetesApi.connect(
                        self.kubernetes.namespace, self.kubernetes.kubeconfig, self.kubernetes.context
                    )
                self._slots = asyncio.Semaphore(self.settings.concurrency)
                self._rate = RateLimit(self.kubernetes.jobs_per_second, self.kubernetes.burst)
                view = ClusterView(
                    self._api,
                    names.selector({names.RUN: names.label_value(self.run_id)}),
                    self.kubernetes.relist_s,
                )
                await view.start()
                self._view = view
        return self._view

    async def run_rollout(self, rollout: Rollout) -> RolloutResult:
        """Run one rollout (or adopt what a previous controller left of it), retrying infra failures."""
        view = await self._start()
        assert self._slots is not None
        attempts: list[AttemptResult] = []
        number = 0
        while True:
            number += 1
            name = names.job_name(rollout.rollout_id, number)
            found = view.jobs.get(name)
            if found is not None and names.RESULT in _annotations(found):
                attempt = self._recorded(found)
            else:
                async with self._slots:
                    attempt = await self._run_attempt(rollout, number, found)
            attempts.append(attempt)
            if attempt.status not in RETRIED or number >= self.settings.max_attempts:
                break
        for done in range(1, number + 1):  # the result is returned: its Jobs are no longer needed
            await self._api_or_fail().delete_job(names.job_name(rollout.rollout_id, done))
            view.forget(names.job_name(rollout.rollout_id, done))
        return RolloutResult(rollout, tuple(attempts))

    async def in_flight(self) -> list[Rollout]:
        """The run's rollouts a killed controller left unfinished (adopt.py): `run_rollout` of each takes its
        Jobs back. Asked before this controller runs any rollout, so that the answer holds none of its own."""
        view = await self._start()
        return unfinished_rollouts(list(view.jobs.values()), self.settings.max_attempts)

    async def aclose(self) -> None:
        if self._view is not None:
            await self._view.stop()
            self._view = None
        if self._api is not None:
            await self._api.close()
            self._api = None
        await asyncio.to_thread(self._provider.shutdown)

    def flush(self) -> None:
        self._provider.force_flush()

    def _api_or_fail(self) -> KubernetesApi:
        assert self._api is not None, "the controller is not started"
        return self._api

    async def _run_attempt(
        self, rollout: Rollout, number: int, found: dict[str, Any] | None
    ) -> AttemptResult:
        api, view = self._api_or_fail(), self._view
        assert view is not None and self._rate is not None
        job, coding = found, self._coding
        if job is None:
            attempt = Attempt(
                rollout_id=rollout.rollout_id,
                attempt=number,
                attempt_id=new_id(),
                group_id=rollout.group_id,
                task_id=rollout.task_id,
                split=rollout.split,
                run_id=self.run_id,
                task=rollout.task,
                traceparent=random_traceparent(),
                started_ns=time.time_ns(),
            )
            timeout_s = self.settings.timeout_s
            try:
                if coding is not None:  # the agent's side of the task only (never `patch`, `test_patch`)
                    attempt = replace(attempt, task=coding.harness_task(rollout))
                manifest = render_job(
                    self.template,
                    attempt,
                    namespace=self.kubernetes.namespace,
                    command=self.settings.command,
                    timeout_s=timeout_s if coding is None else coding.timeout_s(timeout_s),
                    ttl_seconds_after_finished=self.kubernetes.ttl_seconds_after_finished,
                    server_url=self._server_url,
                    user_env=self.settings.env,
                )
                if coding is not None:
                    coding.wrap(manifest, rollout, manifest["metadata"]["name"])
            except (ValueError, OSError) as error:  # a task its Job cannot carry: no Job, said on the span
                record = _Record(RolloutStatus.INFRA_ERROR, None, 0.0, f"{type(error).__name__}: {error}")
                self._export_span(attempt, record)
                return self._result(attempt, record)
            await self._rate.acquire()
            job = await api.create_job(manifest)  # an existing Job of this attempt comes back as it is
            self.jobs_created += 1
            view.put_job(job)
        attempt = _attempt_of(job, rollout, self.run_id)
        name = job["metadata"]["name"]
        try:
            if (job.get("spec") or {}).get("suspend") and _finished(job) is None:
                key = await asyncio.to_thread(self._issue_key, attempt.identity)
                secret = render_secret(attempt, key, job["metadata"]["uid"])
                if coding is not None:
                    secret["data"] = coding.secret_data(rollout)
                await api.create_secret(secret)
                await api.patch_job(name, {"spec": {"suspend": False}})
            end, stop = await self._wait(name)
        except asyncio.CancelledError:
            # The caller gave the rollout up (the end of training, Ctrl-C): as the local controller kills
            # its process, end the Job. A controller that dies without this (a crash, SIGKILL) is adopted.
            self._export_span(
                attempt,
                _Record(
                    RolloutStatus.INFRA_ERROR, None, (time.time_ns() - attempt.started_ns) / 1e9, "cancelled"
                ),
            )
            await asyncio.shield(self._abandon(name))
            raise
        except Exception as error:  # no key, API retries exhausted: the attempt never ran properly
            end, stop = Ending(RolloutStatus.INFRA_ERROR, None, f"{type(error).__name__}: {error}"), True
        status, attributes = end.status, {}
        if coding is not None and end.reason != "Job deleted":
            attributes = coding.attributes(rollout)
            status = await coding.finish(rollout, status, end.exit_code, api, view.pods_of(name), attributes)
        duration_s = max(0.0, (time.time_ns() - attempt.started_ns) / 1e9)
        record = _Record(status, end.exit_code, duration_s, end.reason, attributes)
        await self._copy_log(name, attempt, record)
        self._export_span(attempt, record)
        # Exported before the result is recorded on the Job: a controller killed in between is adopted and
        # exports it again (at least once), where the other order could lose the span.
        await asyncio.to_thread(self._provider.force_flush, FLUSH_MS)
        patch: dict[str, Any] = {"metadata": {"annotations": {names.RESULT: record.annotation()}}}
        if stop:  # a pod stuck (image, scheduling) or removed: suspending the Job ends what is left of it
            patch["spec"] = {"suspend": True}
        if end.reason != "Job deleted":
            await api.patch_job(name, patch)
        await api.delete_secret(name)
        if self._revoke_key is not None:
            await revoke_quietly(self._revoke_key, attempt.identity)
        return self._result(attempt, record)

    async def _abandon(self, name: str) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(ABANDON_S):
                await self._api_or_fail().delete_job(name)  # its Secret goes with it (owner reference)

    async def _wait(self, name: str) -> tuple[Ending, bool]:
        """The attempt's ending, and whether its Job must still be stopped."""
        view, api = self._view, self._api_or_fail()
        assert view is not None
        pods_read = False
        while True:
            job = view.jobs.get(name)
            if job is None:  # not (or no longer) in the cache: ask the API itself
                try:
                    job = await api.read_job(name)
                except Exception as error:
                    if getattr(error, "status", None) == 404:
                        return Ending(RolloutStatus.INFRA_ERROR, None, "Job deleted"), False
                    raise
                view.put_job(job)
            pods = view.pods_of(name)
            found = ending(
                job, pods, now=datetime.now(UTC), pending_timeout_s=self.kubernetes.pending_timeout_s
            )
            if found is not None and found.without_pod and not pods_read:
                # The Jobs' and the Pods' watches are two streams: a Job's failure can arrive before its
                # pod's exit does (seen under load: a harness's own failure retried as an infra error).
                pods_read = True
                if await view.read_pods(name) != pods:
                    continue
            if found is not None:
                return found, _finished(job) is None
            # Without events, wake up to notice a pod pending for too long.
            await view.changed(name, min(CHECK_S, self.kubernetes.pending_timeout_s / 4))

    async def _copy_log(self, name: str, attempt: Attempt, record: _Record) -> None:
        # The harness's output for someone reading the log folder; the attempt's result does not depend on it.
        path = self._log_path(attempt)
        text = f"otel-rl controller: Job {name}: {record.status.value} ({record.reason})\n"
        with contextlib.suppress(Exception):
            text = await self._api_or_fail().pod_log(self._view.pods_of(name), MAX_LOG_BYTES) + text
        await asyncio.to_thread(path.write_text, text)

    def _log_path(self, attempt: Attempt) -> Path:
        return self.settings.log_dir / f"{attempt.rollout_id}-{attempt.attempt_id}.log"

    def _export_span(self, attempt: Attempt, record: _Record) -> None:
        trace_id, span_id = split_traceparent(attempt.traceparent)
        with self._ids.fixed(trace_id, span_id):
            span = self._tracer.start_span(
                attr.ROLLOUT_SPAN_NAME,
                context=otel_context.Context(),  # a root span: the harness's spans are its children
                attributes=attempt.identity,
                start_time=attempt.started_ns,
            )
        span.set_attributes(record.attributes)
        span.set_attribute("otel_rl.kubernetes.reason", record.reason)
        span.set_attribute(attr.ROLLOUT_STATUS, record.status.value)
        if record.exit_code is not None:
            span.set_attribute(attr.ROLLOUT_EXIT_CODE, record.exit_code)
        if record.status is not RolloutStatus.OK:
            span.set_status(Status(StatusCode.ERROR, record.status.value))
        span.end(end_time=attempt.started_ns + int(record.duration_s * 1e9))

    def _recorded(self, job: Mapping[str, Any]) -> AttemptResult:
        annotations = _annotations(job)
        attempt = _attempt_of(job, None, self.run_id)
        return self._result(attempt, _Record.parse(annotations[names.RESULT]))

    def _result(self, attempt: Attempt, record: _Record) -> AttemptResult:
        trace_id, _ = split_traceparent(attempt.traceparent)
        return AttemptResult(
            attempt_id=attempt.attempt_id,
            status=record.status,
            exit_code=record.exit_code,
            trace_id=f"{trace_id:032x}",
            start_time_unix_nano=attempt.started_ns,
            duration_s=record.duration_s,
            log_path=self._log_path(attempt),
        )


def _annotations(job: Mapping[str, Any]) -> dict[str, str]:
    return (job.get("metadata") or {}).get("annotations") or {}


def _finished(job: Mapping[str, Any]) -> str | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return str(condition["type"])
    return None


def _attempt_of(job: Mapping[str, Any], rollout: Rollout | None, run_id: str) -> Attempt:
    """The attempt a Job runs, from its labels and annotations (the Job's, not the caller's, count)."""
    annotations = _annotations(job)
    labels = (job.get("metadata") or {}).get("labels") or {}
    if rollout is not None and annotations.get(names.ROLLOUT_ID) != rollout.rollout_id:
        raise RuntimeError(
            f"Job {job['metadata']['name']} belongs to rollout {annotations.get(names.ROLLOUT_ID)!r}, "
            f"not {rollout.rollout_id!r}: two rollout ids map to one Job name"
        )
    return Attempt(
        rollout_id=annotations[names.ROLLOUT_ID],
        attempt=int(labels[names.ATTEMPT]),
        attempt_id=annotations[names.ATTEMPT_ID],
        group_id=annotations[names.GROUP_ID],
        task_id=annotations[names.TASK_ID],
        split=annotations[names.SPLIT],
        run_id=run_id,
        task=rollout.task if rollout is not None else {},
        traceparent=annotations[names.TRACEPARENT],
        started_ns=int(annotations[names.STARTED_NS]),
    )
