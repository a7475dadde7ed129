"""What the cluster says about one run's Jobs and Pods: a cache kept by a watch, re-listed periodically.

A list gives the full state and a resourceVersion; a watch from that version streams the changes. The
watch is replaced by a new list every `relist_s`, and at once when it drops, when the server answers 410
Gone (the version is too old) or any other error (after a backoff), so a lost event costs at most one
relist period, never an attempt.
"""

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from otel_rl.controller.kubernetes.api import BACKOFF, MAX_BACKOFF_S, Gone, KubernetesApi

log = logging.getLogger(__name__)


def _owner_job(pod: Mapping[str, Any]) -> str | None:
    for owner in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("kind") == "Job":
            return owner.get("name")
    return None


class ClusterView:
    """Jobs by name and their Pods, for one label selector; waiters are woken on every change."""

    def __init__(self, api: KubernetesApi, selector: str, relist_s: float) -> None:
        self._api = api
        self._selector = selector
        self._relist_s = relist_s
        self.jobs: dict[str, dict[str, Any]] = {}
        self._pods: dict[str, dict[str, Any]] = {}  # by pod name
        self._pods_by_job: dict[str, dict[str, dict[str, Any]]] = {}  # Job name -> pod name -> pod
        self._changed: dict[str, asyncio.Event] = {}  # by Job name
        self._tasks: list[asyncio.Task] = []
        self.relists = 0  # how many full lists were taken (for tests and the bench)

    async def start(self) -> None:
        """The first lists (so that a restarted controller sees every Job it left), then keep watching."""
        job_version = await self._list_jobs()
        pod_version = await self._list_pods()
        self._tasks = [
            asyncio.create_task(self._keep("Job", job_version)),
            asyncio.create_task(self._keep("Pod", pod_version)),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def pods_of(self, job: str) -> list[dict[str, Any]]:
        return list(self._pods_by_job.get(job, {}).values())

    def put_job(self, job: dict[str, Any]) -> None:
        """Record a Job the controller has just read or created (newer versions only)."""
        name = job["metadata"]["name"]
        current = self.jobs.get(name)
        if current is None or _version(job) >= _version(current):
            self.jobs[name] = job
        self._wake(name)

    async def changed(self, job: str, timeout_s: float) -> None:
        """Return when the Job or one of its Pods changed, or after timeout_s."""
        event = self._changed.setdefault(job, asyncio.Event())
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns a wait that finished in the tick
        # the caller was cancelled, and the cancel is lost (a cancelled rollout's Job ran on)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await event.wait()
        event.clear()

    async def read_pods(self, job: str) -> list[dict[str, Any]]:
        """The Job's Pods as the API lists them now (the watch may be behind), kept in the cache."""
        items, _ = await self._api.list_pods(self._selector)
        for pod in items:
            if _owner_job(pod) == job:
                self._put_pod(pod)
        return self.pods_of(job)

    def forget(self, job: str) -> None:
        self._changed.pop(job, None)
        if not self._pods_by_job.get(job):
            self._pods_by_job.pop(job, None)

    def _wake(self, job: str | None) -> None:
        if job is not None and job in self._changed:
            self._changed[job].set()

    async def _list_jobs(self) -> str:
        items, version = await self._api.list_jobs(self._selector)
        self.relists += 1
        listed = {job["metadata"]["name"]: job for job in items}
        for name in set(self.jobs) | set(listed):
            if self.jobs.get(name) is not listed.get(name):
                self._wake(name)
        self.jobs = listed
        return version

    async def _list_pods(self) -> str:
        items, version = await self._api.list_pods(self._selector)
        previous = self._pods
        self._pods = {}
        self._pods_by_job = {}
        for pod in items:
            self._put_pod(pod)
        for pod in (*previous.values(), *self._pods.values()):
            self._wake(_owner_job(pod))
        return version

    async def _keep(self, kind: str, version: str) -> None:
        failures = 0
        relist = self._list_jobs if kind == "Job" else self._list_pods
        while True:
            try:
                async for event_type, obj in self._api.watch(kind, self._selector, version, self._relist_s):
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if event_type != "BOOKMARK":
                        self._apply(kind, event_type, obj)
                    failures = 0
                version = await relist()  # the watch ended (its period, or a dropped connection)
            except asyncio.CancelledError:
                raise
            except Gone:
                version = await self._relist_after(relist, 0)
            except Exception as error:  # API errors, dropped connections: the next list catches up
                log.warning("watching %ss: %s; listing again", kind, error)
                failures += 1
                version = await self._relist_after(relist, failures)

    async def _relist_after(self, relist: Any, failures: int) -> str:
        while True:
            await asyncio.sleep(min(MAX_BACKOFF_S, BACKOFF.duration * 2**failures) if failures else 0)
            try:
                return await relist()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("listing: %s; retrying", error)
                failures += 1

    def _apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "Job":
            if event_type == "DELETED":
                self.jobs.pop(name, None)
                self._wake(name)
            else:
                self.put_job(obj)
        else:
            if event_type == "DELETED":
                self._pods.pop(name, None)
                self._pods_by_job.get(_owner_job(obj) or "", {}).pop(name, None)
            else:
                self._put_pod(obj)
            self._wake(_owner_job(obj))

    def _put_pod(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        self._pods[name] = pod
        self._pods_by_job.setdefault(_owner_job(pod) or "", {})[name] = pod


def _version(obj: Mapping[str, Any]) -> int:
    # resourceVersions are opaque strings by contract; etcd's (and the stand-in's) are integers. A newer
    # object replaces an older one only when both compare; otherwise the latest seen wins.
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 1 << 62
