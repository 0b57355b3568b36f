"""Hooks that end training early: on a non-finite loss, or when a metric stops improving."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ember.errors import HookError
from ember.trainer.hooks._util import check_phases, epoch_value, fmt
from ember.trainer.hooks.base import BaseHook, Priority
from ember.trainer.storage import Mode

__all__ = ["EarlyStoppingHook", "TerminateOnNaNHook"]


class TerminateOnNaNHook(BaseHook):
    """Stops training (on every rank) when a training (or test) loss is NaN or infinite.

    The Engine checks training losses first (config ``nonfinite_loss``): with the default
    ``"error"`` it raises a ``NonFiniteLossError`` before this hook sees the loss; use this hook
    with ``nonfinite_loss="warn"`` to stop cleanly instead, or for test losses.

    The check stays on the device between optimizer updates and is read once per update (every
    ``check_every`` updates), so it costs one small host-device copy per update on GPUs; raise
    ``check_every`` to make that rarer. Training stops after the update in which the bad loss
    was seen, with ``trainer.stop_reason`` (and :attr:`reason`) saying when. Test losses, when
    watched, are read once at the end of each test pass.

    Args:
        check_every: read the flag every this many optimizer updates.
        on: the phases whose losses are watched: ``"train"`` (default), ``"test"`` or both.
        priority: default ``ABOVE_NORMAL``.
        name: hook name.

    Attributes:
        reason: why this hook stopped training, or None.

    Example:
        >>> trainer.fit(train_dl, epochs=10, hooks=[hooks.TerminateOnNaNHook()])
        >>> trainer.stop_reason
        'non-finite loss (nan) at step 1234, epoch 3'
    """

    def __init__(
        self,
        check_every: int = 1,
        on: str | Iterable[str] = ("train",),
        priority: int | str = Priority.ABOVE_NORMAL,
        name: str | None = None,
    ) -> None:
        super().__init__(priority, name)
        if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 1:
            raise HookError(f"TerminateOnNaNHook(check_every=...) must be a positive int, got {check_every!r}")
        self.check_every = check_every
        self.on = check_phases(on, "TerminateOnNaNHook")
        self.reason: str | None = None
        self._bad: dict[str, torch.Tensor | None] = {"train": None, "test": None}
        self._worst: dict[str, torch.Tensor | None] = {"train": None, "test": None}
        self._cycles = 0

    def events(self) -> list[str]:
        """The overridden lifecycle methods, less those of a phase this hook does not watch."""
        unwatched = {"after_train_iter"} if "train" not in self.on else set()
        if "test" not in self.on:
            unwatched |= {"after_test_iter", "after_test_epoch"}
        return [e for e in super().events() if e not in unwatched]

    def _note(self, phase: str, loss: Any) -> None:
        """Keep, on the device, whether a non-finite loss was seen in ``phase``, and the first such value."""
        loss = loss.detach()
        bad, seen, worst = ~torch.isfinite(loss), self._bad[phase], self._worst[phase]
        if seen is None or worst is None:
            self._bad[phase], self._worst[phase] = bad, loss
        else:  # keep the first bad value seen
            self._worst[phase] = torch.where(bad & ~seen, loss, worst)
            self._bad[phase] = seen | bad

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Note a non-finite loss on the device; read the note on every ``check_every``-th update."""
        self._note("train", loss)
        if self.trainer.engine.sync_gradients:
            self._cycles += 1
            if self._cycles % self.check_every == 0:
                self._check("train")

    def after_test_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Note a non-finite test loss on the device."""
        self._note("test", loss)

    def after_test_epoch(self) -> None:
        """Read the test pass's note."""
        self._check("test")

    def after_train_epoch(self) -> None:
        """Read any unread note at the epoch's end."""
        self._check("train")

    def _check(self, phase: str) -> None:
        bad, worst = self._bad[phase], self._worst[phase]
        if bad is None or worst is None:
            return
        self._bad[phase] = self._worst[phase] = None
        if bool(bad.item()):
            trainer = self.trainer
            where = f"step {trainer.cur_step}, epoch {trainer.cur_epoch + 1}"
            loss = "loss" if phase == "train" else "test loss"
            self.reason = f"non-finite {loss} ({fmt(float(worst))}) at {where}"
            trainer.logger.error(f"TerminateOnNaNHook: {self.reason}; stopping")
            trainer.stop(self.reason)


class EarlyStoppingHook(BaseHook):
    """Stops training when ``monitor`` has not improved for ``patience`` epochs.

    Runs at the end of each epoch, after that epoch's test pass, so it never acts one epoch
    late. Epochs without a test pass (``test_interval > 1``) are not counted. A monitored name
    that no hook records is an error naming what was recorded.

    Its best value and patience count belong to the run: a ``fit`` with
    ``reset_run_history=True`` starts them afresh, a ``fit`` that continues the history
    continues them (``reset_on_fit`` overrides this). A fit that resumes a checkpoint keeps the
    checkpoint's.

    Args:
        monitor: the history metric, e.g. ``"test/loss"`` or ``"test/accuracy"``.
        patience: epochs without improvement to tolerate.
        mode: ``"min"`` (lower is better; the default) or ``"max"``. Given, it is also the
            metric's mode in a ``TrackingHook``'s run (:meth:`metric_modes`).
        min_delta: the least change that counts as an improvement.
        reset_on_fit: True: start afresh at every ``fit``; False: never; None (default): when
            the ``fit`` resets the run history.
        priority: default ``NORMAL`` (after metric hooks, before checkpoints).
        name: hook name.

    Example:
        >>> hooks.EarlyStoppingHook("test/accuracy", patience=5, mode="max", min_delta=1e-3)
    """

    def __init__(
        self,
        monitor: str = "test/loss",
        patience: int = 3,
        mode: Mode | None = None,
        min_delta: float = 0.0,
        reset_on_fit: bool | None = None,
        priority: int | str = Priority.NORMAL,
        name: str | None = None,
    ) -> None:
        super().__init__(priority, name)
        if not isinstance(monitor, str) or "/" not in monitor:
            raise HookError(f"EarlyStoppingHook(monitor=...) must be a history name like 'test/loss', got {monitor!r}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise HookError(f"EarlyStoppingHook(patience=...) must be a positive int, got {patience!r}")
        if mode not in (None, "min", "max"):
            raise HookError(f"EarlyStoppingHook(mode=...) must be 'min' or 'max', got {mode!r}")
        if isinstance(min_delta, bool) or not isinstance(min_delta, (int, float)) or min_delta < 0:
            raise HookError(f"EarlyStoppingHook(min_delta=...) must be a number >= 0, got {min_delta!r}")
        if reset_on_fit not in (None, True, False):
            raise HookError(f"EarlyStoppingHook(reset_on_fit=...) must be True, False or None, got {reset_on_fit!r}")
        self.monitor, self.patience, self.min_delta = monitor, patience, float(min_delta)
        self.mode: Mode = mode or "min"
        self._mode_given = mode is not None
        self.reset_on_fit = reset_on_fit
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.wait = 0
        self._restored = False  # a state was loaded since the last fit started: that fit keeps it

    def metric_modes(self) -> dict[str, Mode]:
        """The metric this hook watches with the mode it was given: ``{"test/score_gap": "min"}``
        (``{}`` when ``mode`` was left to its default, which says nothing about the metric).

        A ``TrackingHook`` in the same Trainer records it in its run (``Run.define_metric``), so
        the console's and ``ember runs compare``'s "best" of the metric follow it, not its name.

        Example:
            >>> hooks.EarlyStoppingHook("test/score_gap", mode="min").metric_modes()
            {'test/score_gap': 'min'}
        """
        return {self.monitor: self.mode} if self._mode_given else {}

    def reset(self) -> None:
        """Forget the best value and the patience count."""
        self.best, self.best_epoch, self.wait = None, None, 0

    def improved(self, value: float) -> bool:
        """Whether ``value`` beats the best so far by more than ``min_delta`` (NaN never does)."""
        if math.isnan(value):
            return False
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def observe(self, value: float, epoch: int) -> bool:
        """Count one epoch's ``value``: keep it when it improved, else wait one epoch more.

        Returns:
            True when ``patience`` epochs in a row did not improve: time to stop.
        """
        if self.improved(value):
            self.best, self.best_epoch, self.wait = value, epoch, 0
            return False
        self.wait += 1
        return self.wait >= self.patience

    def before_train(self) -> None:
        """Start afresh when this fit begins a new run (see ``reset_on_fit``), unless it resumes a state."""
        fresh = self.trainer.history_reset if self.reset_on_fit is None else self.reset_on_fit
        if fresh and not self._restored:
            self.reset()
        self._restored = False

    def after_train_epoch(self) -> None:
        """Compare this epoch's value with the best; stop after ``patience`` bad epochs."""
        trainer = self.trainer
        value = epoch_value(trainer, self.monitor, "EarlyStoppingHook")
        if value is None or not self.observe(value, trainer.cur_epoch):
            return
        best = "none" if self.best is None else f"{fmt(self.best)} at epoch {(self.best_epoch or 0) + 1}"
        trainer.stop(f"early stopping: {self.monitor} did not improve for {self.patience} epoch(s) (best {best})")

    def state_dict(self) -> dict[str, Any]:
        """Best value, its epoch, and epochs waited."""
        return {"best": self.best, "best_epoch": self.best_epoch, "wait": self.wait}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        missing = {"best", "best_epoch", "wait"} - set(state)
        if missing:
            raise HookError(f"hook {self.name!r}: state lacks {sorted(missing)}; pass what state_dict() returned")
        self.best, self.best_epoch, self.wait = state["best"], state["best_epoch"], int(state["wait"])
        self._restored = True
