"""A Kubernetes API server stand-in on loopback: the real REST and watch protocol for Jobs, Pods and Secrets.

We cannot start Kubernetes here, so this serves the part of its API the rollout controller uses, as the
API server does: JSON objects with uids and resourceVersions, label selectors, lists that carry a
resourceVersion, chunked watch streams from a version (an ERROR event with code 410 once that version is
compacted away), Status bodies for errors, owner-reference garbage collection. Every object sent to it is
validated against the Kubernetes OpenAPI schema (kubernetes-validate, strict). Faults are injected per
request (an HTTP status, a Retry-After), and the watches it serves can be dropped.

A "kubelet" loop plays the cluster: a Job that is not suspended gets a Pod, and the Pod moves through its
phases by the behaviour named in its image's tag, one word per attempt separated by dots (attempt 3 of
`harness:bad-image.ok` runs `ok`, the last word): ok, slow (ok after 1.5 s), fail (exit 1), sleep (runs
until the deadline), bad-image (ErrImagePull, then ImagePullBackOff), evicted, oom, unschedulable, and run:
the container's command executed as a local process (tests/kube_run.py), its exit status, termination
message and output what the pod reports.
A container whose Secret does not exist waits in CreateContainerConfigError, as the kubelet does.
"""

import asyncio
import copy
import functools
import itertools
import json
import re
import threading
import time
import uuid
from base64 import b64decode, b64encode
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import jsonschema
import referencing
from aiohttp import web
from kube_run import LocalContainer
from kubernetes_validate.utils import all_versions, major_minor, schema_contents

K8S_VERSION = "1.32"
TICK_S = 0.02
RUN_S = 0.05  # how long a harness "runs" before it exits
SLOW_S = 1.5  # the same for behaviour "slow", which then succeeds


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


@dataclass
class Fault:
    """Answer the next `times` requests whose method and path match with this status."""

    method: str
    path_contains: str
    status: int
    times: int = 1
    retry_after: str | None = None
    after: bool = False  # do what was asked, then answer the error (a lost answer)


@dataclass
class _Watch:
    kind: str
    selector: dict[str, str]
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)


def _merge_patch(target: Any, patch: Any) -> Any:
    # RFC 7386 (what a strategic merge patch of maps and scalars does too)
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _parse_selector(text: str) -> dict[str, str]:
    selector: dict[str, str] = {}
    for part in filter(None, text.split(",")):
        key, sep, value = part.partition("=")
        if not sep or "!" in key:
            raise ValueError(f"unsupported label selector {part!r}")
        selector[key] = value.removeprefix("=")
    return selector


def _matches(obj: dict[str, Any], selector: dict[str, str]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return all(labels.get(key) == value for key, value in selector.items())


class KubeApiStandIn:
    """Start with `with KubeApiStandIn() as api:`; api.url is its base URL (namespace-scoped paths)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}  # (kind, name) -> object
        self.version = 1
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []  # (rv, kind, event type, object)
        self.oldest = 0  # watches from before this resourceVersion get 410 Gone
        self.faults: list[Fault] = []
        self.invalid: list[str] = []  # schema errors of objects sent to us (a test asserts none)
        self.creates: Counter[tuple[str, str]] = Counter()  # successful creates per (kind, name)
        self.conflicts: Counter[tuple[str, str]] = Counter()  # creates answered 409
        self.requests: Counter[str] = Counter()
        self.envs: dict[str, dict[str, str]] = {}  # pod name -> the environment its harness would see
        self.secrets_ever: set[str] = set()
        self.containers: dict[str, LocalContainer] = {}  # pod name -> its running container (behaviour run)
        # Kinds whose changes no watch streams (a watch far behind): only lists see them.
        self.held_back: set[str] = set()
        self._watches: list[_Watch] = []
        self._pods_by_job: dict[str, set[str]] = {}
        self._live_jobs: set[str] = set()
        self._live_pods: set[str] = set()
        self._pod_started: dict[str, float] = {}
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.url = ""

    # -- lifecycle ------------------------------------------------------------------------------------
    def __enter__(self) -> "KubeApiStandIn":
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "the stand-in did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(10)
        for container in self.containers.values():
            container.stop()

    def call(self, function: Any, *args: Any) -> Any:
        """Run function(*args) in the stand-in's loop (its state is that loop's) and return its result."""
        assert self._loop is not None

        async def run() -> Any:
            return function(*args)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def _serve(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        app = web.Application(middlewares=[self._faults_middleware], client_max_size=4 << 20)
        core, batch = "/api/v1/namespaces/{ns}", "/apis/batch/v1/namespaces/{ns}"
        app.router.add_route("*", batch + "/jobs", self._collection("Job"))
        app.router.add_route("*", batch + "/jobs/{name}", self._item("Job"))
        app.router.add_route("*", core + "/secrets", self._collection("Secret"))
        app.router.add_route("*", core + "/secrets/{name}", self._item("Secret"))
        app.router.add_route("*", core + "/pods", self._collection("Pod"))
        app.router.add_route("GET", core + "/pods/{name}/log", self._log)
        runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        kubelet = asyncio.create_task(self._kubelet())
        self._ready.set()
        await self._stopping.wait()
        kubelet.cancel()
        self.drop_watches()
        await runner.cleanup()

    # -- test controls (call through .call) ----------------------------------------------------------
    def drop_watches(self) -> None:
        """End every open watch stream mid-run (a restarted API server, a dropped connection)."""
        for watch in self._watches:
            watch.queue.put_nowait(None)

    def open_watches(self) -> int:
        """How many watch streams are open now."""
        return len(self._watches)

    def compact(self) -> None:
        """Forget the event history: a watch from an older resourceVersion now gets 410 Gone."""
        self.oldest = self.version
        self.history.clear()

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(obj) for (k, _), obj in self.objects.items() if k == kind]

    # -- storage --------------------------------------------------------------------------------------
    def _store(self, kind: str, obj: dict[str, Any], event: str) -> dict[str, Any]:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        name = obj["metadata"]["name"]
        if event == "DELETED":
            self.objects.pop((kind, name), None)
        else:
            self.objects[(kind, name)] = obj
        # Indexes for the kubelet, which would otherwise scan every object on every tick.
        if kind == "Pod":
            pods = self._pods_by_job.setdefault(_owner(obj) or "", set())
            (pods.discard if event == "DELETED" else pods.add)(name)
            (self._live_pods.discard if event == "DELETED" else self._live_pods.add)(name)
        elif kind == "Job":
            live = event != "DELETED" and not _finished(obj)
            (self._live_jobs.add if live else self._live_jobs.discard)(name)
        snapshot = copy.deepcopy(obj)
        self.history.append((self.version, kind, event, snapshot))
        for watch in self._watches:
            if watch.kind == kind and kind not in self.held_back and _matches(snapshot, watch.selector):
                watch.queue.put_nowait((event, snapshot))
        return obj

    def _create(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        metadata = obj.setdefault("metadata", {})
        metadata.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), namespace="default")
        metadata.setdefault("generation", 1)
        if kind == "Secret":
            strings = obj.pop("stringData", None) or {}  # the API server keeps them base64-encoded in data
            obj["data"] = {
                **(obj.get("data") or {}),
                **{k: b64encode(v.encode()).decode() for k, v in strings.items()},
            }
            self.secrets_ever.add(metadata["name"])
        if kind == "Job":
            obj.setdefault("status", {})
        self.creates[(kind, metadata["name"])] += 1
        return self._store(kind, obj, "ADDED")

    def _delete(self, kind: str, name: str) -> None:
        obj = self.objects.get((kind, name))
        if obj is None:
            return
        if kind == "Pod" and name in self.containers:
            self.containers.pop(name).stop()
        self._store(kind, copy.deepcopy(obj), "DELETED")
        uid = obj["metadata"]["uid"]
        for (other_kind, other_name), other in list(self.objects.items()):  # the garbage collector
            owners = other["metadata"].get("ownerReferences") or []
            if any(owner.get("uid") == uid for owner in owners):
                self._delete(other_kind, other_name)

    # -- HTTP -----------------------------------------------------------------------------------------
    @web.middleware
    async def _faults_middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests[request.method] += 1
        for fault in self.faults:
            if fault.times > 0 and fault.method == request.method and fault.path_contains in request.path_qs:
                fault.times -= 1
                if fault.after:
                    await handler(request)
                headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
                return web.json_response(
                    status_body(fault.status, "Injected", "injected by the test"),
                    status=fault.status,
                    headers=headers,
                )
        return await handler(request)

    def _collection(self, kind: str) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            if request.method == "POST":
                body = await request.json()
                self._validate(body)
                name = body.get("metadata", {}).get("name", "")
                if (kind, name) in self.objects:
                    self.conflicts[(kind, name)] += 1
                    return web.json_response(
                        status_body(409, "AlreadyExists", f'{kind.lower()}s "{name}" already exists'),
                        status=409,
                    )
                return web.json_response(self._create(kind, body), status=201)
            if request.method != "GET":
                return web.json_response(status_body(405, "MethodNotAllowed", request.method), status=405)
            try:
                selector = _parse_selector(request.query.get("labelSelector", ""))
            except ValueError as error:
                return web.json_response(status_body(400, "BadRequest", str(error)), status=400)
            if request.query.get("watch") in ("true", "1"):
                return await self._watch(request, kind, selector)
            items = [
                copy.deepcopy(o) for (k, _), o in self.objects.items() if k == kind and _matches(o, selector)
            ]
            return web.json_response(
                {
                    "kind": f"{kind}List",
                    "apiVersion": "v1" if kind != "Job" else "batch/v1",
                    "metadata": {"resourceVersion": str(self.version)},
                    "items": items,
                }
            )

        return handle

    def _item(self, kind: str) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            name = request.match_info["name"]
            obj = self.objects.get((kind, name))
            if obj is None:
                return web.json_response(
                    status_body(404, "NotFound", f'{kind.lower()}s "{name}" not found'), status=404
                )
            if request.method == "GET":
                return web.json_response(obj)
            if request.method == "DELETE":
                self._delete(kind, name)
                return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"})
            if request.method == "PATCH":
                patched = _merge_patch(obj, await request.json())
                self._validate(patched)
                return web.json_response(self._store(kind, patched, "MODIFIED"))
            return web.json_response(status_body(405, "MethodNotAllowed", request.method), status=405)

        return handle

    async def _log(self, request: web.Request) -> web.StreamResponse:
        container = self.containers.get(request.match_info["name"])
        if container is None:
            return web.Response(text=f"harness output of {request.match_info['name']}\n")
        tail, limit = request.query.get("tailLines"), request.query.get("limitBytes")
        text = container.log(int(tail) if tail else None, int(limit) if limit else None)
        return web.Response(text=text)

    async def _watch(self, request: web.Request, kind: str, selector: dict[str, str]) -> web.StreamResponse:
        since = int(request.query.get("resourceVersion") or self.version)
        timeout_s = float(request.query.get("timeoutSeconds") or 60)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)

        async def send(event: str, obj: dict[str, Any]) -> None:
            await response.write(json.dumps({"type": event, "object": obj}).encode() + b"\n")

        if since < self.oldest:
            await send(
                "ERROR", status_body(410, "Expired", f"too old resource version: {since} ({self.oldest})")
            )
            return response
        watch = _Watch(kind, selector)
        for rv, event_kind, event, obj in self.history:
            if rv > since and event_kind == kind and _matches(obj, selector):
                watch.queue.put_nowait((event, obj))
        self._watches.append(watch)
        deadline = time.monotonic() + timeout_s
        try:
            while (left := deadline - time.monotonic()) > 0:
                try:
                    item = await asyncio.wait_for(watch.queue.get(), left)
                except TimeoutError:
                    break
                if item is None:  # dropped: cut the connection without ending the chunked body
                    if request.transport is not None:
                        request.transport.close()
                    return response
                await send(*item)
        except ConnectionResetError:  # the client went away (aiohttp's reset error is one)
            pass
        finally:
            self._watches.remove(watch)
        return response

    def _validate(self, obj: dict[str, Any]) -> None:
        errors = [
            e.message for e in _validator(obj.get("kind", ""), obj.get("apiVersion", "")).iter_errors(obj)
        ]
        if errors:
            self.invalid.append(f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}: {errors}")

    # -- the cluster ----------------------------------------------------------------------------------
    async def _kubelet(self) -> None:
        names = (f"{n:05x}" for n in itertools.count(0x1000))
        while True:
            await asyncio.sleep(TICK_S)
            for name in list(self._live_jobs):
                self._drive_job(self.objects[("Job", name)], names)
            for name in list(self._live_pods):
                if ("Pod", name) in self.objects:
                    self._drive_pod(self.objects[("Pod", name)])

    def _drive_job(self, job: dict[str, Any], names: Any) -> None:
        name, spec = job["metadata"]["name"], job["spec"]
        pods = [self.objects[("Pod", pod)] for pod in sorted(self._pods_by_job.get(name, ()))]
        if spec.get("suspend"):
            for pod in pods:  # suspending a Job ends its pods
                self._delete("Pod", pod["metadata"]["name"])
            return
        status = job.setdefault("status", {})
        if not pods and not status.get("failed") and not status.get("succeeded"):
            template = copy.deepcopy(spec["template"])
            metadata = template.setdefault("metadata", {})
            metadata["name"] = f"{name}-{next(names)}"
            metadata["labels"] = {
                **(metadata.get("labels") or {}),
                "job-name": name,
                "batch.kubernetes.io/job-name": name,
            }
            metadata["ownerReferences"] = [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                }
            ]
            self._validate({"apiVersion": "v1", "kind": "Pod", **template})
            pod = self._create(
                "Pod", {"apiVersion": "v1", "kind": "Pod", **template, "status": {"phase": "Pending"}}
            )
            self._pod_started[pod["metadata"]["name"]] = time.monotonic()
            self._store("Job", _merge_patch(job, {"status": {"startTime": _now(), "active": 1}}), "MODIFIED")
            return
        deadline = spec.get("activeDeadlineSeconds")
        started = self._pod_started.get(pods[0]["metadata"]["name"]) if pods else None
        if deadline and started and time.monotonic() - started > deadline:
            self._finish(job, "Failed", "DeadlineExceeded")
            for pod in pods:
                self._delete("Pod", pod["metadata"]["name"])
            return
        for pod in pods:
            phase = pod["status"].get("phase")
            if phase == "Succeeded":
                self._finish(job, "Complete", "Completed", succeeded=1)
            elif phase == "Failed":
                self._finish(job, "Failed", "BackoffLimitExceeded", failed=1)

    def _finish(self, job: dict[str, Any], condition: str, reason: str, **counts: int) -> None:
        self._store(
            "Job",
            _merge_patch(
                job,
                {
                    "status": {
                        "active": None,
                        **counts,
                        "conditions": [
                            {
                                "type": condition,
                                "status": "True",
                                "reason": reason,
                                "lastTransitionTime": _now(),
                            }
                        ],
                    }
                },
            ),
            "MODIFIED",
        )

    def _drive_pod(self, pod: dict[str, Any]) -> None:
        status = pod["status"]
        if status.get("phase") in ("Succeeded", "Failed"):
            self._live_pods.discard(pod["metadata"]["name"])
            return
        name = pod["metadata"]["name"]
        container = pod["spec"]["containers"][0]
        words = container["image"].rpartition(":")[2].split(".")
        attempt = int(pod["metadata"]["labels"].get("otel-rl.dev/attempt", "1"))
        behaviour = words[min(attempt, len(words)) - 1]
        elapsed = time.monotonic() - self._pod_started.get(name, time.monotonic())
        if behaviour == "unschedulable":
            self._set_pod(
                pod,
                {
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "lastTransitionTime": _now(),
                            "message": "0/3 nodes are available",
                        }
                    ]
                },
            )
            return
        if behaviour == "bad-image":
            reason = "ErrImagePull" if elapsed < 0.1 else "ImagePullBackOff"
            self._set_pod(pod, {"containerStatuses": [_waiting(container["name"], reason)]})
            return
        env = self._environment(pod)
        if env is None:
            self._set_pod(
                pod, {"containerStatuses": [_waiting(container["name"], "CreateContainerConfigError")]}
            )
            return
        self.envs.setdefault(name, env)
        if status.get("phase") == "Pending":
            self._set_pod(
                pod,
                {
                    "phase": "Running",
                    "startTime": _now(),
                    "containerStatuses": [
                        {
                            "name": container["name"],
                            "ready": True,
                            "restartCount": 0,
                            "image": container["image"],
                            "imageID": "",
                            "state": {"running": {"startedAt": _now()}},
                        }
                    ],
                },
            )
            if behaviour == "run":
                secrets = {key[1]: obj for key, obj in self.objects.items() if key[0] == "Secret"}
                self.containers[name] = LocalContainer(pod, env, secrets)
            return
        if behaviour == "run":
            self._drive_container(pod, container)
            return
        if behaviour == "sleep" or elapsed < (SLOW_S if behaviour == "slow" else RUN_S):
            return
        if behaviour == "evicted":
            self._set_pod(
                pod,
                {
                    "phase": "Failed",
                    "reason": "Evicted",
                    "message": "low on memory",
                    "conditions": [
                        {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}
                    ],
                },
            )
            return
        code, reason = {
            "ok": (0, "Completed"),
            "slow": (0, "Completed"),
            "fail": (1, "Error"),
            "oom": (137, "OOMKilled"),
        }[behaviour]
        terminated = {"exitCode": code, "reason": reason, "startedAt": _now(), "finishedAt": _now()}
        self._set_pod(
            pod,
            {
                "phase": "Succeeded" if code == 0 else "Failed",
                "containerStatuses": [
                    {
                        "name": container["name"],
                        "ready": False,
                        "restartCount": 0,
                        "image": container["image"],
                        "imageID": "",
                        "state": {"terminated": terminated},
                    }
                ],
            },
        )

    def _drive_container(self, pod: dict[str, Any], container: dict[str, Any]) -> None:
        running = self.containers.get(pod["metadata"]["name"])
        code = None if running is None else running.exit_code()
        if running is None or code is None:
            return
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "message": running.message(),
            "startedAt": _now(),
            "finishedAt": _now(),
        }
        self._set_pod(
            pod,
            {
                "phase": "Succeeded" if code == 0 else "Failed",
                "containerStatuses": [
                    {
                        "name": container["name"],
                        "ready": False,
                        "restartCount": 0,
                        "image": container["image"],
                        "imageID": "",
                        "state": {"terminated": terminated},
                    }
                ],
            },
        )

    def _set_pod(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        if all(pod["status"].get(k) == v for k, v in status.items()):
            return  # no change, no event
        self._store("Pod", _merge_patch(pod, {"status": status}), "MODIFIED")

    def _environment(self, pod: dict[str, Any]) -> dict[str, str] | None:
        env: dict[str, str] = {}
        for entry in pod["spec"]["containers"][0].get("env") or []:
            ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
            if ref is None:
                env[entry["name"]] = entry.get("value", "")
                continue
            secret = self.objects.get(("Secret", ref["name"]))
            if secret is None or ref["key"] not in secret.get("data", {}):
                return None
            env[entry["name"]] = b64decode(secret["data"][ref["key"]]).decode()
        return env


@functools.cache
def _validator(kind: str, api_version: str) -> jsonschema.protocols.Validator:
    """kubernetes-validate's strict schema of kind (what its validate() loads on every call, loaded once)."""
    version = [v for v in all_versions() if major_minor(v) <= K8S_VERSION][-1]
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)  # batch/v1 -> batch-v1, as the library
    schema = schema_contents(f"{folder}/{kind.lower()}-{group}.json", K8S_VERSION)
    definitions = schema_contents(f"{folder}/_definitions.json", K8S_VERSION)
    registry = referencing.Registry()
    registry = referencing.Resource.from_contents(schema) @ registry
    registry = referencing.Resource.from_contents(definitions) @ registry
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def _waiting(name: str, reason: str) -> dict[str, Any]:
    return {
        "name": name,
        "ready": False,
        "restartCount": 0,
        "image": "",
        "imageID": "",
        "state": {"waiting": {"reason": reason, "message": f"{reason} (stand-in)"}},
    }


def _owner(pod: dict[str, Any]) -> str | None:
    for owner in pod["metadata"].get("ownerReferences") or []:
        if owner.get("kind") == "Job":
            return owner["name"]
    return None


def _finished(job: dict[str, Any]) -> bool:
    return any(c.get("status") == "True" for c in (job.get("status") or {}).get("conditions") or [])


if (
    __name__ == "__main__"
):  # the stand-in in its own process (bench/kubernetes.py): URL on stdout, until stdin ends
    import sys

    with KubeApiStandIn() as stand_in:
        print(stand_in.url, flush=True)
        sys.stdin.read()
