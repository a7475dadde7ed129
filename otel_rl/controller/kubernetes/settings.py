"""The `controller.kubernetes` section of a training config: where and how rollout Jobs run."""

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from otel_rl.controller.kubernetes.names import check_dns_label


class KubernetesSettings(BaseModel):
    """A cluster, a namespace and a Job template (docs/controller.md, "Rollouts as Kubernetes Jobs")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    template: Path  # a Job manifest (YAML) with Jinja2 placeholders; see render.py
    namespace: str = "default"
    # The cluster's API: None reads the in-cluster service account when running in a pod, else
    # the kubeconfig (KUBECONFIG or ~/.kube/config) and its current context.
    kubeconfig: Path | None = None
    context: str | None = None
    # The otel-rl server as harness pods reach it (a Service URL, e.g. http://otel-rl.otel-rl:4318);
    # None: the URL the controller itself uses, right only when pods can reach that address.
    server_url: str | None = None
    jobs_per_second: float = Field(5.0, gt=0, le=1000)  # creation rate of Jobs (each with its Secret)
    burst: int = Field(10, ge=1, le=1000)  # Jobs created back to back before the rate applies
    # A pod that cannot be scheduled (no node fits, quota) for this long is an infrastructure failure.
    pending_timeout_s: float = Field(600.0, gt=0)
    relist_s: float = Field(60.0, gt=0)  # the watch is replaced by a full list this often
    ttl_seconds_after_finished: int = Field(3600, ge=0)  # the cluster's cleanup if the controller is gone
    # Coding rollouts (`controller.coding`): the harness image's Python with otel-rl installed, which runs the
    # sandbox around the harness in the pod (kubernetes/pod.py).
    sandbox_python: str = Field("python3", min_length=1)

    @field_validator("namespace")
    @classmethod
    def _namespace_is_a_label(cls, value: str) -> str:
        check_dns_label(value, "namespace")
        return value

    @field_validator("server_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"controller.kubernetes.server_url must be an http(s) URL, not {value!r}")
        return value.rstrip("/") if value else value
