"""The Kubernetes API calls of the controller, through the official client's asyncio API, with its retries.

Every call is retried on what a busy or restarting API server answers: 429 and 5xx (after their Retry-After
when they send one), and dropped connections, with exponential backoff and jitter: the client's own port of
client-go's retry loop (`kubernetes.aio.utils.retry`). Not the client's `Configuration.retries`: that one
(aiohttp-retry) never retries POST or PATCH, and a lost answer to a create is exactly what must be retried
(a 409 then finds the object made). Objects come back as plain dicts in the API's own (camelCase) form, as
status.py reads them.
"""

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from kubernetes.aio import client, config
from kubernetes.aio.client.exceptions import ApiException
from kubernetes.aio.utils.retry import Backoff, on_retry_after_error

# 8 calls at most; the n-th retry waits 0.1-0.2 s × 2^(n-1) (jitter 1.0: up to double), or the server's
# Retry-After when that is longer.
BACKOFF = Backoff(steps=8, duration=0.1, factor=2.0, jitter=1.0)
MAX_BACKOFF_S = 10.0  # the longest pause between two relists of a failing watch (cluster.py)
REQUEST_TIMEOUT_S = 30.0
MAX_EVENT_BYTES = 4 << 20  # one watch event (a Job or Pod) is far smaller

T = TypeVar("T")


class Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


class ApiError(RuntimeError):
    """An API answer that retrying will not change (4xx other than 409/429), or retries ran out."""

    def __init__(self, what: str, status: int | None, detail: str) -> None:
        super().__init__(f"Kubernetes API: {what}: HTTP {status}: {detail[:500]}")
        self.status = status


def retriable(error: Exception) -> bool:
    """Whether a failed call is worth another try: 429, 5xx, a dropped connection or a timeout."""
    if isinstance(error, ApiException):
        return error.status == 429 or (error.status is not None and error.status >= 500)
    return isinstance(error, (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError))


async def retried(what: str, call: Callable[[], Awaitable[T]]) -> T:
    """call(), retried on 429, 5xx and connection errors; ApiError once retrying cannot help."""
    try:
        return await on_retry_after_error(BACKOFF, retriable, call)
    except ApiException as error:
        raise ApiError(what, error.status, str(error.body or error.reason)) from None
    except Exception as error:
        if not retriable(error):
            raise
        raise ApiError(what, None, f"{type(error).__name__}: {error}") from None


class KubernetesApi:
    """Jobs, Pods and Secrets in one namespace."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self._client = api_client
        self.namespace = namespace
        self._batch = client.BatchV1Api(api_client)
        self._core = client.CoreV1Api(api_client)

    @classmethod
    async def connect(cls, namespace: str, kubeconfig: Path | None, context: str | None) -> "KubernetesApi":
        """In a pod: its service account (unless a kubeconfig is named); elsewhere: the kubeconfig."""
        configuration = client.Configuration()
        if kubeconfig is None and context is None:
            try:
                config.load_incluster_config(client_configuration=configuration)
                return cls(client.ApiClient(configuration), namespace)
            except config.ConfigException:
                pass
        try:
            await config.load_kube_config(
                config_file=str(kubeconfig) if kubeconfig else None,
                context=context,
                client_configuration=configuration,
            )
        except (config.ConfigException, OSError) as error:
            where = kubeconfig or "KUBECONFIG / ~/.kube/config"
            raise ValueError(
                f"controller.kubernetes: no cluster to talk to: not in a pod, and the kubeconfig ({where}) "
                f"cannot be used: {error}"
            ) from None
        return cls(client.ApiClient(configuration), namespace)

    async def close(self) -> None:
        await self._client.close()

    def _plain(self, model: Any) -> dict[str, Any]:
        return self._client.sanitize_for_serialization(model)

    async def create_job(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create the Job; when it exists already (a retried or repeated create), return the existing one."""
        name = manifest["metadata"]["name"]
        try:
            created = await retried(
                f"create Job {name}",
                lambda: self._batch.create_namespaced_job(
                    self.namespace, client.V1Job.from_dict(manifest), _request_timeout=REQUEST_TIMEOUT_S
                ),
            )
            return self._plain(created)
        except ApiError as error:
            if error.status != 409:
                raise
        return await self.read_job(name)

    async def read_job(self, name: str) -> dict[str, Any]:
        job = await retried(
            f"read Job {name}",
            lambda: self._batch.read_namespaced_job(name, self.namespace, _request_timeout=REQUEST_TIMEOUT_S),
        )
        return self._plain(job)

    async def patch_job(self, name: str, patch: dict[str, Any]) -> None:
        await retried(
            f"patch Job {name}",
            lambda: self._batch.patch_namespaced_job(
                name, self.namespace, patch, _request_timeout=REQUEST_TIMEOUT_S
            ),
        )

    async def delete_job(self, name: str) -> None:
        """Delete the Job and, in the background, its pods; a Job already gone is fine."""
        body = client.V1DeleteOptions(propagation_policy="Background")
        await self._delete(
            f"delete Job {name}",
            lambda: self._batch.delete_namespaced_job(
                name, self.namespace, body=body, _request_timeout=REQUEST_TIMEOUT_S
            ),
        )

    async def create_secret(self, manifest: dict[str, Any]) -> None:
        name = manifest["metadata"]["name"]
        try:
            await retried(
                f"create Secret {name}",
                lambda: self._core.create_namespaced_secret(
                    self.namespace, client.V1Secret.from_dict(manifest), _request_timeout=REQUEST_TIMEOUT_S
                ),
            )
        except ApiError as error:
            if error.status != 409:  # made by a create whose answer was lost: the same attempt's key
                raise

    async def delete_secret(self, name: str) -> None:
        await self._delete(
            f"delete Secret {name}",
            lambda: self._core.delete_namespaced_secret(
                name, self.namespace, _request_timeout=REQUEST_TIMEOUT_S
            ),
        )

    async def _delete(self, what: str, call: Callable[[], Awaitable[Any]]) -> None:
        try:
            await retried(what, call)
        except ApiError as error:
            if error.status != 404:
                raise

    async def pod_log(
        self, pods: list[dict[str, Any]], limit_bytes: int, tail_lines: int | None = None
    ) -> str:
        """The harness container's log of the attempt's last pod (empty without one); its last tail_lines
        lines when given."""
        if not pods:
            return ""
        pod = max(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")
        container = pod["spec"]["containers"][0]["name"]
        return await retried(
            f"read the log of {pod['metadata']['name']}",
            lambda: self._core.read_namespaced_pod_log(
                pod["metadata"]["name"],
                self.namespace,
                container=container,
                limit_bytes=limit_bytes,
                **({} if tail_lines is None else {"tail_lines": tail_lines}),
                _request_timeout=REQUEST_TIMEOUT_S,
            ),
        )

    async def list_jobs(self, selector: str) -> tuple[list[dict[str, Any]], str]:
        """The Jobs matching selector, and the list's resourceVersion to watch from."""
        listed = await retried(
            "list Jobs",
            lambda: self._batch.list_namespaced_job(
                self.namespace, label_selector=selector, _request_timeout=REQUEST_TIMEOUT_S
            ),
        )
        plain = self._plain(listed)
        return plain.get("items") or [], plain["metadata"]["resourceVersion"]

    async def list_pods(self, selector: str) -> tuple[list[dict[str, Any]], str]:
        listed = await retried(
            "list Pods",
            lambda: self._core.list_namespaced_pod(
                self.namespace, label_selector=selector, _request_timeout=REQUEST_TIMEOUT_S
            ),
        )
        plain = self._plain(listed)
        return plain.get("items") or [], plain["metadata"]["resourceVersion"]

    async def watch(
        self, kind: str, selector: str, resource_version: str, timeout_s: float
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(event type, object) from resource_version on, until the server ends the watch.

        Raises Gone when the server no longer has that version, ApiError or a connection error otherwise
        (the caller lists again: the watch is a cache refresher, never the only source of truth)."""
        method = (
            self._batch.list_namespaced_job_without_preload_content
            if kind == "Job"
            else self._core.list_namespaced_pod_without_preload_content
        )
        response = await method(
            self.namespace,
            label_selector=selector,
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=max(1, int(timeout_s)),
            _request_timeout=timeout_s + REQUEST_TIMEOUT_S,
        )
        try:
            if response.status != 200:
                body = (await response.content.read(64 << 10)).decode(errors="replace")
                if response.status == 410:
                    raise Gone(body)
                raise ApiError(f"watch {kind}s", response.status, body)
            while line := await response.content.readline():  # b"": the server ended the watch
                if len(line) > MAX_EVENT_BYTES:
                    raise ApiError(f"watch {kind}s", None, f"a watch event over {MAX_EVENT_BYTES} bytes")
                if not line.strip():
                    continue
                event = json.loads(line)
                kind_of_event, obj = event.get("type"), event.get("object") or {}
                if kind_of_event == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone(str(obj.get("message")))
                    raise ApiError(f"watch {kind}s", obj.get("code"), str(obj.get("message")))
                yield kind_of_event, obj
        finally:
            response.release()
