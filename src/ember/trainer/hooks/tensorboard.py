"""Write per-step scalars and per-epoch metrics to TensorBoard (optional dependency)."""

from __future__ import annotations

import os
from typing import Any

from ember import distributed
from ember.errors import HookError
from ember.trainer.hooks.base import Priority
from ember.trainer.hooks.writer import StepWriter

__all__ = ["TensorboardHook"]


def _summary_writer_class() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise HookError(
            f"TensorboardHook needs the 'tensorboard' package, which is not installed: pip install tensorboard ({exc})"
        ) from None
    return SummaryWriter


class TensorboardHook(StepWriter):
    """Writes ``trainer.storage`` scalars every ``every_n`` updates and the history each epoch.

    A :class:`~ember.trainer.hooks.writer.StepWriter`: per-step tags are the storage names
    plus ``lr``, each scalar's newest value put since the last write, at the optimizer step.
    Per-epoch tags are ``epoch/<metric>`` (``epoch/test/accuracy``) at step = epoch number.
    Only rank 0 writes.

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
        super().__init__(every_n, priority, name)
        self._writer_cls = _summary_writer_class()
        self.log_dir = os.fspath(log_dir)
        self.writer: Any = None

    def before_train(self) -> None:
        """Open the writer on rank 0."""
        if distributed.rank() == 0 and self.writer is None:
            self.writer = self._writer_cls(log_dir=self.log_dir)

    def writes_at(self, step: int) -> bool:
        """Rank 0 only: the others read nothing."""
        return self.writer is not None

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """Add each scalar at ``step``."""
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)

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
