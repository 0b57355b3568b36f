"""Write per-step scalars and per-epoch metrics to TensorBoard (optional dependency)."""

from __future__ import annotations

import os
from typing import Any

from ember import distributed
from ember.errors import HookError
from ember.trainer.hooks._util import current_lr
from ember.trainer.hooks.base import BaseHook, Priority

__all__ = ["TensorboardHook"]


def _summary_writer_class() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise HookError(
            f"TensorboardHook needs the 'tensorboard' package, which is not installed: pip install tensorboard ({exc})"
        ) from None
    return SummaryWriter


class TensorboardHook(BaseHook):
    """Writes ``trainer.storage`` scalars every ``every_n`` updates and the history each epoch.

    Only rank 0 writes. Per-step tags are the storage names plus ``lr``; per-epoch tags are
    ``epoch/<metric>`` (``epoch/test/accuracy``) at step = epoch number.

    Args:
        log_dir: the event files' directory.
        every_n: optimizer updates between per-step writes.
        priority: default ``BELOW_NORMAL``.
        name: hook name.

    Raises:
        HookError: at construction, when the ``tensorboard`` package is missing.

    Example:
        >>> hooks.TensorboardHook("runs/tb", every_n=20)
    """

    def __init__(
        self, log_dir: str | os.PathLike[str], every_n: int = 10, priority: int | str = Priority.BELOW_NORMAL,
        name: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(priority, name)
        if isinstance(every_n, bool) or not isinstance(every_n, int) or every_n < 1:
            raise HookError(f"TensorboardHook(every_n=...) must be a positive int, got {every_n!r}")
        self._writer_cls = _summary_writer_class()
        self.log_dir, self.every_n = os.fspath(log_dir), every_n
        self.writer: Any = None
        self._last_step = -1

    def before_train(self) -> None:
        """Open the writer on rank 0."""
        if distributed.rank() == 0 and self.writer is None:
            self.writer = self._writer_cls(log_dir=self.log_dir)

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Write the newest value of each storage scalar every ``every_n`` updates."""
        trainer = self.trainer
        if self.writer is None or not trainer.step_applied or trainer.cur_step % self.every_n:
            return
        storage = trainer.storage
        fresh = [n for n in storage.names() if storage.latest_step(n) > self._last_step]
        for name, value in storage.latest_all(fresh).items():
            self.writer.add_scalar(name, value, trainer.cur_step)
        lr = current_lr(trainer)
        if lr is not None:
            self.writer.add_scalar("lr", lr, trainer.cur_step)
        self._last_step = trainer.cur_step

    def after_train_epoch(self) -> None:
        """Write the epoch's metrics."""
        if self.writer is None:
            return
        trainer = self.trainer
        for name, value in trainer.history.at(trainer.cur_epoch).items():
            self.writer.add_scalar(f"epoch/{name}", value, trainer.cur_epoch + 1)
        self.writer.flush()

    def after_train(self) -> None:
        """Close the writer."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
