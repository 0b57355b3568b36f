"""Hooks that measure time: per-epoch durations, and throughput with an ETA."""

from __future__ import annotations

from collections.abc import Iterable
from time import perf_counter
from typing import TYPE_CHECKING, Any

from ember._format import format_duration
from ember.errors import HookError
from ember.trainer.hooks._epoch_log import EpochLogHook
from ember.trainer.hooks.base import BaseHook, Priority

if TYPE_CHECKING:
    from ember.trainer.trainer import Trainer

__all__ = ["LogTimingByEpochHook", "ThroughputHook", "ThroughputMeter"]


class LogTimingByEpochHook(EpochLogHook):
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

    # the clocks of the epoch under way (None: not started); set by the lifecycle methods below
    _start: float | None = None
    _train_s: float | None = None
    _test_start: float | None = None
    _test_s: float | None = None

    def before_train(self) -> None:
        """Start the clock (a resumed epoch has no ``before_train_epoch``)."""
        self._start = perf_counter()

    def before_train_epoch(self) -> None:
        """Start timing the epoch."""
        self._start, self._train_s, self._test_s = perf_counter(), None, None

    def before_test(self) -> None:
        """The training part ends where testing starts."""
        now = perf_counter()
        if self._start is not None and self._train_s is None and self.trainer.fitting:
            self._train_s = now - self._start
        self._test_start = now

    def after_test(self) -> None:
        """Stop the test clock."""
        if self._test_start is not None:
            self._test_s = perf_counter() - self._test_start

    def after_train_epoch(self) -> None:
        """Log the epoch's times."""
        if self._train_s is None and self._start is not None:
            self._train_s = perf_counter() - self._start
        self.last = {"train_s": self._train_s or 0.0}
        parts = [f"epoch {self.trainer.cur_epoch + 1} timing", f"train {format_duration(self.last['train_s'])}"]
        if self._test_s is not None:
            self.last["test_s"] = self._test_s
            parts.append(f"test {format_duration(self._test_s)}")
        self._log_line(parts)


class ThroughputMeter:
    """Samples/s, seconds per update and the time left, measured over windows of updates.

    The one measurement of throughput in ember: every ``every_n`` optimizer updates it puts
    ``throughput/samples_per_s`` (all ranks together), ``time/step_s`` and, when the run's length
    is known, ``time/eta_s`` into ``trainer.storage``, where every writer reads them. Test passes
    are left out of the windows. Times are host wall-clock; over several steps they match the
    device's pace. A :class:`ThroughputHook` drives one; a writer that needs throughput when no
    ThroughputHook is registered (``TrackingHook``) drives its own. Its methods are named after
    the hook events they belong to: call each from that event.

    A reader on its own clock (``ProgressBarHook``, at its redraws) may end windows itself with
    :meth:`close_if_updated` instead of calling :meth:`after_update`.

    Args:
        every_n: updates per measurement window.
        owner: who builds it, named by the error about a bad ``every_n``.
        publish: put the figures into ``trainer.storage`` (False: keep them on the meter only,
            for a display that must not add a second series for the writers).

    Example:
        >>> meter = ThroughputMeter(every_n=10)
        >>> meter.after_update(trainer)     # from a hook's after_update
        >>> trainer.storage.latest("throughput/samples_per_s")
    """

    def __init__(self, every_n: int, *, owner: str = "ThroughputMeter", publish: bool = True) -> None:
        if isinstance(every_n, bool) or not isinstance(every_n, int) or every_n < 1:
            raise HookError(f"{owner}(every_n=...) must be a positive int, got {every_n!r}")
        self.every_n, self.publish = every_n, bool(publish)
        self._t0 = 0.0
        self._samples0 = self._steps0 = 0
        self.epoch_time = 0.0
        """Seconds measured in this epoch (test passes left out)."""
        self.epoch_samples = self.epoch_steps = 0
        self.samples_per_s: float | None = None
        """The last window's samples per second, all ranks together."""
        self.step_s: float | None = None
        """The last window's seconds per optimizer update."""
        self.eta_s: float | None = None
        """The updates left times :attr:`step_s` (None while the run's length is unknown)."""

    def _mark(self, trainer: Trainer, now: float | None = None) -> None:
        self._t0 = perf_counter() if now is None else now
        self._samples0, self._steps0 = trainer.samples_seen, trainer.cur_step

    def before_train(self, trainer: Trainer) -> None:
        """Start a window."""
        self._mark(trainer)

    def before_train_epoch(self, trainer: Trainer) -> None:
        """Start the epoch's totals and a window."""
        self.epoch_time, self.epoch_samples, self.epoch_steps = 0.0, 0, 0
        self._mark(trainer)

    def after_update(self, trainer: Trainer) -> None:
        """Close the window once it holds ``every_n`` updates."""
        if trainer.cur_step - self._steps0 >= self.every_n:
            self.close(trainer)

    def before_test(self, trainer: Trainer) -> None:
        """Close the window so that the test pass is not counted."""
        if trainer.fitting:
            self.close(trainer)

    def after_test(self, trainer: Trainer) -> None:
        """Start a window after the test pass."""
        if trainer.fitting:
            self._mark(trainer)

    def after_train_epoch(self, trainer: Trainer) -> None:
        """Close the epoch's last window (when it holds an update)."""
        self.close_if_updated(trainer)

    def close_if_updated(self, trainer: Trainer) -> None:
        """End the window now if it holds an optimizer update (else it goes on)."""
        if trainer.cur_step > self._steps0:
            self.close(trainer)

    def close(self, trainer: Trainer) -> None:
        """End the window now: put its figures into the storage and start the next one."""
        now = perf_counter()
        elapsed = now - self._t0
        samples, steps = trainer.samples_seen - self._samples0, trainer.cur_step - self._steps0
        self.epoch_time += elapsed
        self.epoch_samples += samples
        self.epoch_steps += steps
        if elapsed > 0 and steps > 0:
            self.samples_per_s, self.step_s = samples / elapsed, elapsed / steps
            left = trainer.steps_left
            if left is not None:
                self.eta_s = left * self.step_s
            if self.publish:
                trainer.storage.put_scalar("throughput/samples_per_s", self.samples_per_s)
                trainer.storage.put_scalar("time/step_s", self.step_s)
                if left is not None:
                    trainer.storage.put_scalar("time/eta_s", left * self.step_s)
        self._mark(trainer, now)


class ThroughputHook(BaseHook):
    """Measures samples/s, time per optimizer update and the time left, without syncing.

    Every ``every_n`` updates its :class:`ThroughputMeter` puts ``throughput/samples_per_s``
    (all ranks together), ``time/step_s`` and, when the run's length is known, ``time/eta_s``
    into ``trainer.storage`` (the step logger, TensorBoard and tracking write them from there);
    the hook logs a summary at each epoch's end. Test passes are excluded from the measurement.

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
        self.meter = ThroughputMeter(every_n, owner="ThroughputHook")
        self.every_n, self._logger, self.ranks = every_n, logger, None if ranks is None else list(ranks)

    @property
    def samples_per_s(self) -> float | None:
        """The last window's samples per second, all ranks together (None before the first)."""
        return self.meter.samples_per_s

    @property
    def step_s(self) -> float | None:
        """The last window's seconds per optimizer update."""
        return self.meter.step_s

    @property
    def eta_s(self) -> float | None:
        """The time left, in seconds, at the last window's pace (None when the length is unknown)."""
        return self.meter.eta_s

    def before_train(self) -> None:
        """Start a window."""
        self.meter.before_train(self.trainer)

    def before_train_epoch(self) -> None:
        """Start the epoch's totals."""
        self.meter.before_train_epoch(self.trainer)

    def after_update(self) -> None:
        """Close a window every ``every_n`` updates."""
        self.meter.after_update(self.trainer)

    def before_test(self) -> None:
        """Close the window so the test pass is not counted."""
        self.meter.before_test(self.trainer)

    def after_test(self) -> None:
        """Restart the window after the test pass."""
        self.meter.after_test(self.trainer)

    def after_train_epoch(self) -> None:
        """Log the epoch's throughput."""
        meter = self.meter
        meter.after_train_epoch(self.trainer)
        if self._logger is False or meter.epoch_time <= 0 or meter.epoch_steps == 0:
            return
        rate, step = meter.epoch_samples / meter.epoch_time, meter.epoch_time / meter.epoch_steps
        parts = [f"epoch {self.trainer.cur_epoch + 1} throughput", f"{rate:.0f} samples/s", f"{step * 1e3:.1f} ms/step"]
        if meter.eta_s is not None:
            parts.append(f"ETA {format_duration(meter.eta_s)}")
        logger = self._logger if self._logger is not None else self.trainer.logger
        logger.info(" | ".join(parts), ranks=self.ranks)
