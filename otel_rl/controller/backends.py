"""Where rollouts run: the one place that turns a config's `controller` section into a rollout runner.

`local` runs each attempt as a harness process on this machine (local.py); `kubernetes` runs it as a Job
on a cluster (kubernetes/). Both take the same ControllerSettings (command, limits, retries) and the same
connection to the otel-rl server, and hand back the same RolloutResult.
"""

from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, model_validator

from otel_rl.coding.settings import CodingSection
from otel_rl.controller.coding import coding_launcher
from otel_rl.controller.kubernetes.settings import KubernetesSettings
from otel_rl.controller.local import Controller, ControllerSettings, KeyIssuer, KeyRevoker
from otel_rl.controller.rollouts import Rollout, RolloutResult


class ControllerSection(BaseModel):
    """The `controller` section of a training config: which backend runs the rollouts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["local", "kubernetes"] = "local"
    kubernetes: KubernetesSettings | None = None  # required by, and only allowed with, backend kubernetes
    coding: CodingSection | None = None  # coding tasks: each attempt sandboxed, graded outside its sandbox

    @model_validator(mode="after")
    def _settings_match_backend(self) -> "ControllerSection":
        if self.backend == "kubernetes" and self.kubernetes is None:
            raise ValueError(
                "backend kubernetes needs a `controller.kubernetes` section (template, namespace)"
            )
        if self.backend == "local" and self.kubernetes is not None:
            raise ValueError("`controller.kubernetes` is set but backend is local: set backend: kubernetes")
        return self


class RolloutRunner(Protocol):
    """What the online loop and `otel-rl rollouts run` need from a controller."""

    async def run_rollout(self, rollout: Rollout) -> RolloutResult: ...

    async def in_flight(self) -> list[Rollout]:
        """Rollouts a previous controller of the same run left running, for `run_rollout` to take back."""
        ...

    async def aclose(self) -> None: ...


class LocalRunner:
    """The local Controller behind the RolloutRunner protocol."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    async def run_rollout(self, rollout: Rollout) -> RolloutResult:
        return await self.controller.run_rollout(rollout)

    async def in_flight(self) -> list[Rollout]:
        # A harness process is its controller's child: a new controller can neither watch nor wait for it.
        return []

    async def aclose(self) -> None:
        await self.controller.stop_forkserver()
        self.controller.close()  # exports the spans still queued, then stops the exporter


def open_controller(
    section: ControllerSection,
    settings: ControllerSettings,
    *,
    otlp_endpoint: str,
    openai_base_url: str,
    token: str,
    issue_key: KeyIssuer,
    revoke_key: KeyRevoker,
    run_id: str = "",
    post_reward: Callable[[Mapping[str, Any]], None] | None = None,
) -> RolloutRunner:
    """A rollout runner for the configured backend; close it with `await runner.aclose()`.

    `revoke_key` is called with an attempt's identity once it has ended: its key stops working.
    `run_id` labels the Kubernetes Jobs of one training run (the local backend has no use for it).
    `post_reward` posts a grader's reward with the admin token: needed with a `coding` section.
    """
    connection = {
        "otlp_endpoint": otlp_endpoint,
        "openai_base_url": openai_base_url,
        "token": token,
        "issue_key": issue_key,
        "revoke_key": revoke_key,
    }
    launcher = None
    if section.coding is not None:
        if post_reward is None:
            raise ValueError(
                "a `controller.coding` section needs post_reward: the grader's rewards are posted"
            )
        launcher = coding_launcher(section.coding, admin_token=token, post_reward=post_reward)
    if section.backend == "kubernetes":
        from otel_rl.controller.kubernetes.coding import KubernetesCoding
        from otel_rl.controller.kubernetes.controller import KubernetesController

        assert section.kubernetes is not None  # the section's validator guarantees it
        coding = None  # the sandbox in each Job's pod, the grader here (kubernetes/coding.py)
        if launcher is not None:
            coding = KubernetesCoding(launcher, admin_token=token, python=section.kubernetes.sandbox_python)
        return KubernetesController(settings, section.kubernetes, run_id=run_id, coding=coding, **connection)
    return LocalRunner(Controller(settings, **connection, launcher=launcher))
