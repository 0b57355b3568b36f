"""Hooks that write metrics to a logger: per epoch from the history, per step from the storage."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ember import distributed
from ember.errors import HookError
from ember.trainer.hooks._util import current_lr, fmt
from ember.trainer.hooks.base import BaseHook, Priority
from ember.trainer.hooks.writer import StepWriter
from ember.trainer.storage import Reduce

__all__ = ["LogMetricByEpochHook", "LogMetricByStepHook"]


def _log(hook: BaseHook, logger: Any, ranks: list[int] | None, message: str) -> None:
    """Log ``message`` with ``logger``, or the Trainer's when it is None."""
    (logger if logger is not None else hook.trainer.logger).info(message, ranks=ranks)


class LogMetricByEpochHook(BaseHook):
    """Logs every metric of the epoch (train and test) and the learning rate, once per epoch.

    Also logs the metrics of a standalone ``trainer.evaluate(...)``.

    Args:
        logger: an ember ``DistributedLogger`` (default: the Trainer's).
        interval: log every this many epochs (and the last).
        ranks: ranks that log (default rank 0).
        priority: default ``BELOW_NORMAL``: after metric hooks, before the LR scheduler steps.
        name: hook name.

    Example:
        >>> hooks.LogMetricByEpochHook(logger)
        # epoch 3/10 | train/loss 0.2134 | test/loss 0.1877 | test/accuracy 0.9512 | lr 0.05
    """

    def __init__(
        self,
        logger: Any = None,
        interval: int = 1,
        ranks: Iterable[int] | None = (0,),
        priority: int | str = Priority.BELOW_NORMAL,
        name: str | None = None,
    ) -> None:
        super().__init__(priority, name)
        self._logger, self.ranks = logger, None if ranks is None else list(ranks)
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise HookError(f"LogMetricByEpochHook(interval=...) must be a positive int, got {interval!r}")
        self.interval = interval

    def after_train_epoch(self) -> None:
        """Log this epoch's line."""
        trainer = self.trainer
        nth, total = trainer.cur_epoch + 1, trainer.max_epochs
        last = total is not None and nth >= total
        if nth % self.interval and not last and trainer.stop_reason is None:
            return
        parts = [f"epoch {nth}" + (f"/{total}" if total is not None else "")]
        metrics = trainer.history.at(trainer.cur_epoch)
        ordered = sorted(metrics, key=lambda k: (not k.startswith("train/"), not k.startswith("test/")))
        parts += [f"{k} {fmt(metrics[k])}" for k in ordered]
        lr = current_lr(trainer)
        if lr is not None:
            parts.append(f"lr {lr:.4g}")
        _log(self, self._logger, self.ranks, " | ".join(parts))

    def after_test(self) -> None:
        """Log the result of a standalone ``evaluate``."""
        trainer = self.trainer
        if not trainer.fitting:
            metrics = trainer.test_metrics
            line = " | ".join(f"{k} {fmt(v)}" for k, v in metrics.items()) or "no metrics"
            _log(self, self._logger, self.ranks, f"evaluation | {line}")


class LogMetricByStepHook(StepWriter):
    """Logs the per-step scalars of ``trainer.storage`` every ``every_n`` optimizer updates.

    A :class:`~ember.trainer.hooks.writer.StepWriter`: each scalar is averaged over the values
    put since the last log line (every micro-batch's, with gradient accumulation) and, with
    ``sync``, over ranks (one all-reduce per log line, not per step); the learning rate is the
    one the last update used. Reading the values is the only host-device synchronisation.

    Args:
        every_n: optimizer updates between log lines.
        logger: an ember ``DistributedLogger`` (default: the Trainer's).
        sync: average the scalars across ranks.
        ranks: ranks that log (default rank 0).
        priority: default ``BELOW_NORMAL``.
        name: hook name.

    Example:
        >>> hooks.LogMetricByStepHook(every_n=50)
        # step 500 | epoch 2 | train/loss 0.3112 | lr 0.1
    """

    reduce: Reduce = "mean"

    def __init__(
        self,
        every_n: int = 50,
        logger: Any = None,
        sync: bool = True,
        ranks: Iterable[int] | None = (0,),
        priority: int | str = Priority.BELOW_NORMAL,
        name: str | None = None,
    ) -> None:
        super().__init__(every_n, priority, name)
        self._logger, self.ranks, self.sync = logger, None if ranks is None else list(ranks), sync

    def new_scalars(self) -> dict[str, float]:
        """The means since the last line, averaged over ranks too with ``sync`` (every rank calls this)."""
        scalars = super().new_scalars()
        if self.sync and scalars and distributed.is_active():
            t = torch.tensor(list(scalars.values()), dtype=torch.float64, device=distributed.collective_device())
            scalars = dict(zip(scalars, (distributed.all_reduce(t) / distributed.world_size()).tolist(), strict=True))
        return scalars

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """Log ``step | epoch | name value | ...``."""
        parts = [f"step {step}", f"epoch {self.trainer.cur_epoch + 1}"]
        parts += [f"{n} {fmt(v)}" for n, v in scalars.items()]
        _log(self, self._logger, self.ranks, " | ".join(parts))
