"""Trainer callbacks of the example scripts: a wall-clock limit on training (``--max_train_minutes``)."""

from __future__ import annotations

import logging
import time
from typing import Any

from transformers import TrainerCallback

logger = logging.getLogger(__name__)

__all__ = ["TrainingTimeLimit", "time_limit_callbacks"]


class TrainingTimeLimit(TrainerCallback):
    """Stop training once ``max_minutes`` of wall-clock time have passed since it began (checked after every
    optimizer step), with a warning that says at which step and epoch.

    A guard for a run that must end in time (a job on a lent GPU), not a schedule: the learning-rate schedule is
    planned for the run's epochs or steps, and a run stopped early ends before the schedule does. Choose the epochs
    so that the run should finish within the time, and let this only catch a slower machine. The clock starts when
    training begins (after data loading; compilation, which happens in the first steps, counts), and anew in a
    resumed run. The run then saves and evaluates as after a finished one.
    """

    def __init__(self, max_minutes: float) -> None:
        if not max_minutes > 0:  # also refuses NaN
            raise ValueError(f"--max_train_minutes {max_minutes}: must be a positive number of minutes.")
        self.max_minutes = max_minutes
        self.start: float | None = None
        self.stopped_at_step: int | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.start = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.start is None or control.should_training_stop:
            return
        minutes = (time.monotonic() - self.start) / 60
        if minutes < self.max_minutes or state.global_step >= state.max_steps:
            return
        control.should_training_stop = True
        self.stopped_at_step = state.global_step
        epochs = args.num_train_epochs if args.max_steps <= 0 else state.num_train_epochs
        logger.warning(
            f"--max_train_minutes {self.max_minutes:g}: stopped training early after {minutes:.2f} minutes, at step "
            f"{state.global_step} of {state.max_steps} (epoch {state.epoch or 0:.2f} of {epochs:g}); the "
            "learning-rate schedule did not reach its end."
        )


def time_limit_callbacks(max_minutes: float | None) -> list[TrainerCallback]:
    """``[TrainingTimeLimit(max_minutes)]``, or no callback when ``max_minutes`` is None."""
    return [] if max_minutes is None else [TrainingTimeLimit(max_minutes)]
