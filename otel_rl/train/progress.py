"""The online loop's progress bar: steps done, the phase of the current one, and a line per step."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from otel_rl.train.records import StepRecord, format_step


class StepProgress:
    """`with StepProgress(console, steps, done) as progress:` shows the bar until the block ends."""

    def __init__(self, console: Console, steps: int, done: int) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[phase]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self._bar = self._progress.add_task("online", total=steps, completed=done, phase="")

    @property
    def console(self) -> Console:
        """Print through this while the bar is shown, so that lines appear above it."""
        return self._progress.console

    def show(self, phase: str) -> None:
        """What the current step is doing."""
        self._progress.update(self._bar, phase=phase)

    def step_done(self, record: StepRecord) -> None:
        self._progress.update(self._bar, completed=record.step)
        self.console.print(format_step(record))

    def __enter__(self) -> StepProgress:
        self._progress.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._progress.__exit__(kind, error, traceback)
