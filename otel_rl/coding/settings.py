"""The `controller.coding` section of a training configuration: rollouts of coding tasks, each in a sandbox
and graded outside it (docs/coding.md)."""

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


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
