"""Hooks that write metrics to a logger: per epoch from the history, per step from the storage."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ember import distributed
from ember.errors import HookError
from ember.trainer.hooks._util import current_lr, fmt
from ember.trainer.hooks.base import BaseHook, Priority

__all__ = ["LogMetricByEpochHook", "LogMetricByStepHook"]


class _LoggingHook(BaseHook):
    def __init__(self, logger: Any, ranks: Iterable[int] | None, priority: int | str, name: str | None) -> None:
        super().__init__(priority, name)
        self._logger = logger
        self.ranks = None if ranks is None else list(ranks)

    def _log(self, message: str) -> None:
        logger = self._logger if self._logger is not None else self.trainer.logger
        logger.info(message, ranks=self.ranks)


class LogMetricByEpochHook(_LoggingHook):
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
        super().__init__(logger, ranks, priority, name)
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
        self._log(" | ".join(parts))

    def after_test(self) -> None:
        """Log the result of a standalone ``evaluate``."""
        trainer = self.trainer
        if not trainer.fitting:
            metrics = trainer.test_metrics
            self._log("evaluation | " + (" | ".join(f"{k} {fmt(v)}" for k, v in metrics.items()) or "no metrics"))


class LogMetricByStepHook(_LoggingHook):
    """Logs the per-step scalars of ``trainer.storage`` every ``every_n`` optimizer updates.

    Each scalar is averaged over the values put since the last log line and, with ``sync``,
    over ranks (one all-reduce per log line, not per step); the learning rate is the one the
    last update used. Reading the values is the only host-device synchronisation.

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

    def __init__(
        self,
        every_n: int = 50,
        logger: Any = None,
        sync: bool = True,
        ranks: Iterable[int] | None = (0,),
        priority: int | str = Priority.BELOW_NORMAL,
        name: str | None = None,
    ) -> None:
        super().__init__(logger, ranks, priority, name)
        if isinstance(every_n, bool) or not isinstance(every_n, int) or every_n < 1:
            raise HookError(f"LogMetricByStepHook(every_n=...) must be a positive int, got {every_n!r}")
        self.every_n, self.sync = every_n, sync
        self._last_step = -1

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Log a line on every ``every_n``-th update."""
        trainer = self.trainer
        if not trainer.step_applied or trainer.cur_step % self.every_n:
            return
        storage = trainer.storage
        names, means = [], []
        for name in storage.names():
            recent = [v for s, v in storage.values(name) if s > self._last_step]
            if recent:
                names.append(name)
                means.append(sum(recent) / len(recent))
        self._last_step = trainer.cur_step
        if self.sync and names and distributed.is_active():
            t = torch.tensor(means, dtype=torch.float64, device=distributed.collective_device())
            means = (distributed.all_reduce(t) / distributed.world_size()).tolist()
        parts = [f"step {trainer.cur_step}", f"epoch {trainer.cur_epoch + 1}"]
        parts += [f"{n} {fmt(v)}" for n, v in zip(names, means, strict=True)]
        lr = current_lr(trainer)
        if lr is not None:
            parts.append(f"lr {lr:.4g}")
        self._log(" | ".join(parts))
