"""The training backend (`backend` in the config): who runs the updates, otel-rl's trainer or verl's engine.

Both take the same batches (verl `DataProto`s built by otel_rl.transforms.to_dataproto) and report the same
metric names, so the online loop and the offline modes do not know which one they drive.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from verl import DataProto

    from otel_rl.train.config import TrainConfig


class TrainerBackend(Protocol):
    """What the loops call on a trainer (otel_rl.train.trainer.Trainer is the reference)."""

    tokenizer: Any

    def step(self, batch: DataProto) -> dict[str, float]:
        """One RL update on a batch; metrics named as Trainer.step names them (loss, mismatch, ...)."""
        ...

    def sft_step(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor
    ) -> dict[str, float]:
        """One supervised update on a right-padded batch (Trainer.sft_step)."""
        ...

    def save(self, directory: Path) -> Path:
        """The weights as a Hugging Face folder vLLM reloads."""
        ...

    def save_state(self, directory: Path) -> Path:
        """What resuming needs beyond the weights (optimizer, schedule), beside them; returns the file."""
        ...

    def load_state(self, directory: Path) -> None:
        """Continue from what save_state wrote."""
        ...

    def close(self) -> None:
        """Release the backend's processes and devices."""
        ...


def make_trainer(config: TrainConfig) -> TrainerBackend:
    """The trainer of `config.backend`, holding the policy of `config.model`."""
    if config.backend == "verl":
        from otel_rl.train.verl import VerlTrainer

        return VerlTrainer(config)
    from otel_rl.train.trainer import Trainer

    return Trainer(config)
