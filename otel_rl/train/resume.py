"""Where an online run resumes: its run id, the state saved in its latest checkpoint, the policy the servers
serve at the start, and the finished groups a previous run left untrained."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from otel_rl.controller import new_id
from otel_rl.store import reads
from otel_rl.train.groups import reusable_groups

if TYPE_CHECKING:
    from otel_rl.train.config import TrainConfig
    from otel_rl.train.server_client import ServerClient
    from otel_rl.train.worker import TrainerProcess

STATE_FILE = "online_state.json"  # in each step-N checkpoint: what a restart resumes from
RUN_FILE = "run.json"  # in output_dir: the run's id, the prefix of its group ids


@dataclass
class OnlineState:
    """What a restart resumes from, saved as STATE_FILE in every checkpoint."""

    step: int = 0  # updates done
    version: int = 0  # the gateway's policy version of this run's current weights
    next_group: int = 0  # groups launched: the position in the task order
    consumed: list[str] = field(default_factory=list)  # group ids trained on, all steps


def run_id_of(output_dir: Path) -> str:
    """The run's id, created on the first start; it prefixes every group id of the run."""
    path = output_dir / RUN_FILE
    if path.is_file():
        return json.loads(path.read_text())["run_id"]
    output_dir.mkdir(parents=True, exist_ok=True)
    run_id = new_id()[:12]
    path.write_text(json.dumps({"run_id": run_id}))
    return run_id


def latest_checkpoint(output_dir: Path) -> tuple[Path, OnlineState] | None:
    """The newest complete step-N checkpoint of an online run and its state, if any."""
    found = [
        (int(path.parent.name.removeprefix("step-")), path.parent)
        for path in output_dir.glob(f"step-*/{STATE_FILE}")
        if path.parent.name.removeprefix("step-").isdigit()
    ]
    if not found:
        return None
    _, directory = max(found)
    return directory, OnlineState(**json.loads((directory / STATE_FILE).read_text()))


def save_checkpoint(trainer: TrainerProcess, state: OnlineState, output_dir: Path) -> Path:
    """step-N: the weights vLLM reloads, plus the state a restart resumes from (written atomically)."""
    final = output_dir / f"step-{state.step}"
    partial = output_dir / f".step-{state.step}.partial"
    trainer.save(partial)
    state_file = trainer.save_state(partial).name
    (partial / STATE_FILE).write_text(json.dumps(asdict(state)))
    if final.exists():
        shutil.rmtree(final)
    os.replace(partial, final)
    # Only the newest checkpoint is resumed from: older ones keep their weights, not the optimizer (a file
    # of the local backend's, a folder of verl's).
    previous = output_dir / f"step-{state.step - 1}" / state_file
    if previous.is_dir():
        shutil.rmtree(previous)
    previous.unlink(missing_ok=True)
    return final


def publish_start(client: ServerClient, checkpoint: Path, state: OnlineState) -> None:
    """Make every server serve this run's current weights (versions only increase on a gateway)."""
    current = client.policy()
    if current["checkpoint"] == str(Path(checkpoint).resolve()) and current["version"] == state.version:
        return  # a restart of the loop against a server that already serves its weights
    # Keep this run's numbering when the server restarted (its version went back to 0).
    state.version = max(current["version"] + 1, state.version)
    client.set_policy(checkpoint, state.version)


def unused_groups(client: ServerClient, config: TrainConfig, run_id: str, state: OnlineState) -> list[str]:
    """The groups of this run that finished but were never trained on, fresh enough to train on now, at most
    as many as the staleness bound lets be in flight (more would only go stale again)."""
    rows = reads.run_train_rollouts(client.query, run_id)
    group_size = config.algorithm.group_size
    found = reusable_groups(
        rows,
        consumed=set(state.consumed),
        group_size=group_size,
        trained=state.version,
        max_staleness=config.algorithm.max_staleness,
    )
    if not found:
        return []
    # Finished means the controller's status span is in the store for every rollout, as during the run: the
    # harnesses of a loop killed with SIGKILL may end on their own later, but no controller saw them do so.
    finals = reads.final_attempts(client.query, found).group_by("group_id").len()
    finished = set(finals.filter(pl.col("len") == group_size)["group_id"])
    return [group for group in found if group in finished][: config.algorithm.max_outstanding_groups]
