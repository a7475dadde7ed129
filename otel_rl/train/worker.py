"""The trainer in a process of its own, for the online loop: the backend `make_trainer` chooses.

In one process the loop's threads (the event loop running harness processes, store polling, exporters, the
progress bar) and the trainer's many short torch operations share one GIL, and each operation waits up to
the interpreter's switch interval to get it back: a 0.4 s update of the tiny model took 12 s beside one busy
Python thread. In the demo the update's median went from 3.9 s to 3.1-3.8 s; the rest of it is the two
cores being shared with vLLM and the harnesses.
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import signal
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from verl import DataProto

    from otel_rl.train.config import TrainConfig

_trainer: Any = None  # the worker process's TrainerBackend


class TrainerProcessError(RuntimeError):
    """The trainer failed with an exception that cannot cross the process boundary (e.g. a Ray task's)."""


class TrainerProcess:
    """A TrainerBackend in a child process, with the methods the online loop calls; each call is a round
    trip."""

    def __init__(self, config: TrainConfig) -> None:
        # spawn, not fork: a fork would copy the caller's locks without the threads that hold them
        self._pool = ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn"), initializer=_ignore_interrupts
        )
        try:
            self.pad_token_id: int = self._call(_start, config)
        except BaseException:
            self.close()
            raise

    def step(self, batch: DataProto) -> dict[str, float]:
        """One policy update (Trainer.step)."""
        return self._call(_run, "step", batch)

    def save(self, directory: Path) -> Path:
        """The weights as a folder vLLM reloads (Trainer.save)."""
        return self._call(_run, "save", directory)

    def save_state(self, directory: Path) -> Path:
        """The optimizer state beside the weights (Trainer.save_state)."""
        return self._call(_run, "save_state", directory)

    def load_state(self, directory: Path) -> None:
        """Resume the optimizer state (Trainer.load_state)."""
        self._call(_run, "load_state", directory)

    def close(self) -> None:
        """Close the backend (verl's stops its Ray workers), then the process."""
        try:
            with suppress(BrokenProcessPool):  # the process died: nothing left to close in it
                self._call(_close)
        finally:
            self._pool.shutdown(cancel_futures=True)

    def _call(self, function: Callable, *args: Any) -> Any:
        return self._pool.submit(function, *args).result()


def _ignore_interrupts() -> None:
    # Ctrl-C reaches the whole process group: the loop handles it and closes this process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start(config: TrainConfig) -> int:
    from transformers.utils import logging as hf_logging

    from otel_rl.train.backend import make_trainer

    hf_logging.disable_progress_bar()  # the loop's own progress bar says what is happening
    import verl.plugin.platform.platform_manager  # noqa: F401  (it sets its logger's level when imported)

    # Without a GPU verl warns on first use that it found no accelerator; the config names the device.
    logging.getLogger("verl.plugin.platform.platform_manager").setLevel(logging.ERROR)
    global _trainer
    _trainer = make_trainer(config)
    return _trainer.tokenizer.pad_token_id


def _run(method: str, *args: Any) -> Any:
    try:
        return getattr(_trainer, method)(*args)
    except Exception as error:
        try:
            pickle.dumps(error)
        except Exception:
            # Ray's task errors are classes made at run time: the parent would get a PicklingError instead
            # of the message, which carries the remote traceback.
            raise TrainerProcessError(f"{type(error).__name__}: {error}") from None
        raise


def _close() -> None:
    global _trainer
    if _trainer is not None:  # None: make_trainer failed
        _trainer.close()
        _trainer = None
