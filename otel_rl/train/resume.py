"""Where an online run resumes: its run id and the state saved in its latest checkpoint."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from otel_rl.controller import new_id

if TYPE_CHECKING:
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
    # Only the newest checkpoint is resumed from: older ones keep their weights, not the optimizer.
    (output_dir / f"step-{state.step - 1}" / state_file).unlink(missing_ok=True)
    return final
