"""tqdm progress bars on rank 0, refreshed a few times per second at most."""

from __future__ import annotations

import sys
import time
from typing import IO, Any

import torch
from tqdm import tqdm

from ember import distributed
from ember.batch import batches_per_epoch
from ember.errors import HookError
from ember.trainer.hooks._util import current_lr
from ember.trainer.hooks.base import BaseHook, Priority
from ember.trainer.hooks.timing import ThroughputHook, ThroughputMeter

__all__ = ["ProgressBarHook"]

_SAMPLES_PER_S = "throughput/samples_per_s"


def _length(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


class ProgressBarHook(BaseHook):
    """A tqdm bar per training epoch and per test pass, on rank 0 only (to stderr).

    The postfix shows the loss, the learning rate and samples/s. Per batch the hook only counts
    and reads the clock; it touches the bar (and reads the loss, a host-device sync) at most
    once per ``refresh_s`` seconds. ``fit(display_progress=True)`` adds one.

    Samples/s is ember's one measurement of throughput: with a :class:`ThroughputHook`
    registered, the ``throughput/samples_per_s`` it put into ``trainer.storage`` last; without
    one, a :class:`ThroughputMeter` of the bar's own whose windows end at its redraws (test
    passes left out) and which puts nothing into the storage.

    Args:
        refresh_s: least seconds between bar updates.
        file: the stream (default ``sys.stderr``).
        priority: default ``VERY_LOW`` (after everything that computes).
        name: hook name.

    Example:
        >>> trainer.fit(train_dl, epochs=3, display_progress=True)
        epoch 1/3:  45%|████▌     | 45/100 [00:02<00:02, 21.3it/s, loss=0.412, lr=0.1, samples/s=1.4e+03]
    """

    def __init__(
        self, refresh_s: float = 0.5, file: IO[str] | None = None, priority: int | str = Priority.VERY_LOW,
        name: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(priority, name)
        if not isinstance(refresh_s, (int, float)) or refresh_s < 0:
            raise HookError(f"ProgressBarHook(refresh_s=...) must be a number >= 0, got {refresh_s!r}")
        self.refresh_s, self.file = float(refresh_s), file
        self._bars: dict[str, Any] = {}
        self._pending: dict[str, int] = {}
        self._last = 0.0  # when a bar was last redrawn
        self._meter: ThroughputMeter | None = None  # ours, when no ThroughputHook measures
        self._epoch_done = False
        self.refreshes = 0
        """How many times a bar was redrawn (tests check it stays small)."""

    def _open(self, phase: str, total: int | None, initial: int, desc: str, leave: bool) -> None:
        self._close(phase)
        if distributed.rank() != 0:
            return
        self._bars[phase] = tqdm(
            total=total, initial=initial, desc=desc, leave=leave, file=self.file or sys.stderr,
            dynamic_ncols=True, mininterval=0, smoothing=0.1,
        )  # fmt: skip
        self._pending[phase] = 0
        self._last = time.monotonic()

    def _tick(self, phase: str, loss: Any) -> None:
        if phase not in self._bars:
            return
        self._pending[phase] += 1
        if time.monotonic() - self._last >= self.refresh_s:
            self._flush(phase, loss)

    def _flush(self, phase: str, loss: Any = None) -> None:
        bar = self._bars.get(phase)
        if bar is None:
            return
        postfix: dict[str, str] = {}
        if loss is not None:
            postfix["loss"] = f"{float(loss.detach() if isinstance(loss, torch.Tensor) else loss):.4g}"
        if phase == "train":
            lr = current_lr(self.trainer)
            if lr is not None:
                postfix["lr"] = f"{lr:.3g}"
            rate = self._samples_per_s()
            if rate is not None:
                postfix["samples/s"] = f"{rate:.3g}"
        bar.set_postfix(postfix, refresh=False)
        bar.update(self._pending[phase])
        self._pending[phase] = 0
        self._last = time.monotonic()
        self.refreshes += 1

    def _samples_per_s(self) -> float | None:
        """The ThroughputHook's last figure, or our meter's over the updates since the last redraw."""
        storage = self.trainer.storage
        if self._meter is None:
            return storage.latest(_SAMPLES_PER_S) if _SAMPLES_PER_S in storage else None
        self._meter.close_if_updated(self.trainer)
        return self._meter.samples_per_s

    def _close(self, phase: str) -> None:
        bar = self._bars.pop(phase, None)
        if bar is not None:
            if self._pending.get(phase):
                bar.update(self._pending[phase])
            bar.close()

    def before_train(self) -> None:
        """Measure throughput with a meter of our own unless a ThroughputHook does."""
        measured = any(isinstance(h, ThroughputHook) for h in self.trainer.hooks)
        self._meter = None if measured else ThroughputMeter(1, owner="ProgressBarHook", publish=False)
        if self._meter is not None:
            self._meter.before_train(self.trainer)

    def before_train_epoch(self) -> None:
        """Open the epoch's bar."""
        self._epoch_done = False
        if self._meter is not None:
            self._meter.before_train_epoch(self.trainer)
        self._open_train()

    def _open_train(self) -> None:
        t = self.trainer
        total = t.max_epochs
        desc = f"epoch {t.cur_epoch + 1}" + (f"/{total}" if total is not None else "")
        self._open("train", batches_per_epoch(t.train_dataloader), t.epoch_iter, desc, leave=True)

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Count the batch; redraw if ``refresh_s`` has passed; close the bar after the last batch."""
        if "train" not in self._bars and distributed.rank() == 0 and not self._epoch_done:  # resumed mid-epoch
            self._open_train()
        self._tick("train", loss)
        bar = self._bars.get("train")
        if bar is not None and bar.total is not None and bar.n + self._pending["train"] >= bar.total:
            if self._pending["train"]:  # else this batch's tick just redrew it (a second redraw has no throughput)
                self._flush("train", loss)
            self._close("train")  # before the epoch's log lines are written
            self._epoch_done = True

    def before_test(self) -> None:
        """Close the training bar (an epoch ended early) before the test bar opens."""
        self._close("train")
        if self._meter is not None:
            self._meter.before_test(self.trainer)

    def after_test(self) -> None:
        """Measure throughput again after a test pass within ``fit``."""
        if self._meter is not None:
            self._meter.after_test(self.trainer)

    def after_train_epoch(self) -> None:
        """Close the epoch's bar."""
        self._close("train")
        self._epoch_done = False

    def before_test_epoch(self) -> None:
        """Open the test bar."""
        t = self.trainer
        self._open("test", _length(t.eval_dataloader), 0, "test", leave=not t.fitting)

    def after_test_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Count the batch; redraw if ``refresh_s`` has passed."""
        self._tick("test", loss)

    def after_test_epoch(self) -> None:
        """Close the test bar."""
        self._close("test")

    def after_train(self) -> None:
        """Close any bar left open (training raised or stopped)."""
        for phase in list(self._bars):
            self._close(phase)
