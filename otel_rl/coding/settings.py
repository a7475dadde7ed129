"""The `controller.coding` section of a training configuration: rollouts of coding tasks, each in a sandbox
and graded outside it (docs/coding.md)."""

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from otel_rl.coding.rollout import CodingLauncher, RewardPoster


class CodingSection(BaseModel):
    """Which task file the rollouts' tasks come from (a training task's `id` is its `instance_id`), what
    the harness needs inside, the sandbox's and the grader's limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks: Path
    # "unsandboxed" (by name only): a plain process with the rlimits, where bubblewrap cannot run
    mode: Literal["bubblewrap", "unsandboxed"] = "bubblewrap"
    binds: list[Path] = Field(default_factory=list, max_length=64)  # read-only, at the same path inside
    cpu_seconds: int = Field(default=600, gt=0)
    memory_bytes: int = Field(default=4 << 30, gt=0)
    processes: int = Field(default=256, gt=0)
    file_bytes: int = Field(default=1 << 30, gt=0)
    wall_seconds: float = Field(default=1800.0, gt=0)
    grader_cpu_seconds: int = Field(default=600, gt=0)
    grader_wall_seconds: float = Field(default=900.0, gt=0)
    grader_test_timeout_seconds: float = Field(default=60.0, gt=0)  # one hidden test; past it: failed
    # the harness's exit statuses that say its CLI stopped at its own turn or context limit
    truncated_exit_codes: list[int] = Field(default_factory=list, max_length=64)
    # online training: every this many steps, probe_k rollouts a training task with the current policy, and
    # the groups after draw from the tasks curation keeps (otel_rl/train/reprobe.py); 0: never
    reprobe_every: int = Field(default=0, ge=0)
    probe_k: int = Field(default=4, ge=1, le=64)
    always_fail_share: float = Field(default=0.2, ge=0, lt=1)  # curation's cap on always-fail tasks

    def launcher(self, *, admin_token: str, post_reward: "RewardPoster") -> "CodingLauncher":
        """The controller's launcher for this section; SandboxError where the sandbox cannot start here."""
        from otel_rl.coding import sandbox
        from otel_rl.coding.rollout import CodingLauncher
        from otel_rl.coding.tasks import load_tasks

        limits = sandbox.Limits(
            cpu_seconds=self.cpu_seconds, memory_bytes=self.memory_bytes, processes=self.processes,
            file_bytes=self.file_bytes, wall_seconds=self.wall_seconds,
        )  # fmt: skip
        grader = sandbox.Limits(cpu_seconds=self.grader_cpu_seconds, wall_seconds=self.grader_wall_seconds)
        return CodingLauncher(
            load_tasks(self.tasks), admin_token=admin_token, post_reward=post_reward, limits=limits,
            grader_limits=grader, binds=self.binds, truncated_exit_codes=self.truncated_exit_codes,
            mode=self.mode, test_timeout_s=self.grader_test_timeout_seconds,
        )  # fmt: skip
