"""Hooks that measure time: per-epoch durations, and throughput with an ETA."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from ember.errors import HookError
from ember.trainer.hooks.base import BaseHook, Priority

__all__ = ["LogTimingByEpochHook", "ThroughputHook"]


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{sec:02d}s" if hours else f"{minutes}m{sec:02d}s"


class LogTimingByEpochHook(BaseHook):
    """Logs how long each epoch's training and test pass took (host wall-clock time).

    Args:
        logger: an ember ``DistributedLogger`` (default: the Trainer's).
        ranks: ranks that log (default rank 0).
        priority: default ``BELOW_NORMAL``.
        name: hook name.

    Attributes:
        last: ``{"train_s": ..., "test_s": ...}`` of the last epoch.

    Example:
        >>> hooks.LogTimingByEpochHook()
        # epoch 2 timing | train 12.3s | test 1.4s
    """

    def __init__(
        self, logger: Any = None, ranks: Iterable[int] | None = (0,), priority: int | str = Priority.BELOW_NORMAL,
        name: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(priority, name)
        self._logger, self.ranks = logger, None if ranks is None else list(ranks)
        self._start: float | None = None
        self._train_s: float | None = None
        self._test_start: float | None = None
        self._test_s: float | None = None
        self.last: dict[str, float] = {}

    def before_train(self) -> None:
        """Start the clock (a resumed epoch has no ``before_train_epoch``)."""
        self._start = time.perf_counter()

    def before_train_epoch(self) -> None:
        """Start timing the epoch."""
        self._start, self._train_s, self._test_s = time.perf_counter(), None, None

    def before_test(self) -> None:
        """The training part ends where testing starts."""
        now = time.perf_counter()
        if self._start is not None and self._train_s is None and self.trainer.fitting:
            self._train_s = now - self._start
        self._test_start = now

    def after_test(self) -> None:
        """Stop the test clock."""
        if self._test_start is not None:
            self._test_s = time.perf_counter() - self._test_start

    def after_train_epoch(self) -> None:
        """Log the epoch's times."""
        if self._train_s is None and self._start is not None:
            self._train_s = time.perf_counter() - self._start
        self.last = {"train_s": self._train_s or 0.0}
        parts = [f"epoch {self.trainer.cur_epoch + 1} timing", f"train {_duration(self.last['train_s'])}"]
        if self._test_s is not None:
            self.last["test_s"] = self._test_s
            parts.append(f"test {_duration(self._test_s)}")
        logger = self._logger if self._logger is not None else self.trainer.logger
        logger.info(" | ".join(parts), ranks=self.ranks)


class ThroughputHook(BaseHook):
    """Measures samples/s, time per optimizer update and the time left, without syncing.

    Every ``every_n`` updates it puts ``throughput/samples_per_s`` (all ranks together),
    ``time/step_s`` and, when the run's length is known, ``time/eta_s`` into
    ``trainer.storage`` (the progress bar and step logger show them), and logs a summary at
    each epoch's end. Test passes are excluded from the measurement. Times are host
    wall-clock; over several steps they match the device's pace.

    Args:
        every_n: updates per measurement window.
        logger: an ember ``DistributedLogger`` (default: the Trainer's); ``False`` turns the
            epoch summary off.
        ranks: ranks that log (default rank 0).
        priority: default ``BELOW_NORMAL``.
        name: hook name.

    Example:
        >>> hooks.ThroughputHook(every_n=20)
        # epoch 1 throughput | 5120 samples/s | 12.5 ms/step | ETA 3m12s
    """

    def __init__(
        self, every_n: int = 10, logger: Any = None, ranks: Iterable[int] | None = (0,),
        priority: int | str = Priority.BELOW_NORMAL, name: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(priority, name)
        if isinstance(every_n, bool) or not isinstance(every_n, int) or every_n < 1:
            raise HookError(f"ThroughputHook(every_n=...) must be a positive int, got {every_n!r}")
        self.every_n, self._logger, self.ranks = every_n, logger, None if ranks is None else list(ranks)
        self._t0 = 0.0
        self._samples0 = self._steps0 = 0
        self._epoch_time = 0.0
        self._epoch_samples = self._epoch_steps = 0
        self.samples_per_s: float | None = None
        self.step_s: float | None = None
        self.eta_s: float | None = None

    def _mark(self) -> None:
        self._t0 = time.perf_counter()
        self._samples0, self._steps0 = self.trainer.samples_seen, self.trainer.cur_step

    def before_train(self) -> None:
        """Start a window."""
        self._mark()

    def before_train_epoch(self) -> None:
        """Start the epoch's totals."""
        self._epoch_time, self._epoch_samples, self._epoch_steps = 0.0, 0, 0
        self._mark()

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Close a window every ``every_n`` updates."""
        trainer = self.trainer
        if trainer.step_applied and trainer.cur_step - self._steps0 >= self.every_n:
            self._close_window()

    def _close_window(self) -> None:
        trainer = self.trainer
        elapsed = time.perf_counter() - self._t0
        samples, steps = trainer.samples_seen - self._samples0, trainer.cur_step - self._steps0
        self._epoch_time += elapsed
        self._epoch_samples += samples
        self._epoch_steps += steps
        if elapsed > 0 and steps > 0:
            self.samples_per_s, self.step_s = samples / elapsed, elapsed / steps
            trainer.storage.put_scalar("throughput/samples_per_s", self.samples_per_s)
            trainer.storage.put_scalar("time/step_s", self.step_s)
            left = trainer.steps_left
            if left is not None:
                self.eta_s = left * self.step_s
                trainer.storage.put_scalar("time/eta_s", self.eta_s)
        self._mark()

    def before_test(self) -> None:
        """Close the window so the test pass is not counted."""
        if self.trainer.fitting:
            self._close_window()

    def after_test(self) -> None:
        """Restart the window after the test pass."""
        if self.trainer.fitting:
            self._mark()

    def after_train_epoch(self) -> None:
        """Log the epoch's throughput."""
        if self.trainer.cur_step > self._steps0:
            self._close_window()
        if self._logger is False or self._epoch_time <= 0 or self._epoch_steps == 0:
            return
        rate, step = self._epoch_samples / self._epoch_time, self._epoch_time / self._epoch_steps
        parts = [f"epoch {self.trainer.cur_epoch + 1} throughput", f"{rate:.0f} samples/s", f"{step * 1e3:.1f} ms/step"]
        if self.eta_s is not None:
            parts.append(f"ETA {_duration(self.eta_s)}")
        logger = self._logger if self._logger is not None else self.trainer.logger
        logger.info(" | ".join(parts), ranks=self.ranks)
