"""Colossal-AI's ``colossalai.trainer.hooks``: its hooks, with its signatures, on ember's.

Each hook is ember's own (from :mod:`ember.trainer.hooks`) with Colossal-AI's constructor and
default priority; they mix freely with ember's native hooks in one ``fit``. A hook of your own
subclasses :class:`BaseHook` and writes its lifecycle methods as Colossal-AI does, the trainer
first (``def after_train_iter(self, trainer, output, label, loss)``); the methods without it
(``self.trainer`` instead) work too. Lower priorities run first, as in Colossal-AI; ember takes
0 to 100.

Colossal-AI's defaults: ``LossHook`` and ``AccuracyHook`` 0, ``LRSchedulerHook`` 1 (it steps
before the logging hooks log, so they show the next rate), the logging, memory, timing,
TensorBoard and throughput hooks 10. ``SaveCheckpointHook`` runs last (ember's ``LOWEST``), so
that the state it saves is complete.
"""

from __future__ import annotations

import abc
import inspect
import os
from collections.abc import Callable
from typing import Any

from torch import Tensor

from ember.errors import HookError
from ember.logging import DistributedLogger
from ember.trainer import hooks as _native
from ember.trainer.hooks.base import get_priority

from ..context import ParallelMode

__all__ = [
    "AccuracyHook",
    "BaseHook",
    "LRSchedulerHook",
    "LogMemoryByEpochHook",
    "LogMetricByEpochHook",
    "LogMetricByStepHook",
    "LogTimingByEpochHook",
    "LossHook",
    "MetricHook",
    "SaveCheckpointHook",
    "TensorboardHook",
    "ThroughputHook",
]


class _TrainerFirst:
    """Colossal-AI's lifecycle methods, the trainer first, doing nothing."""

    def after_hook_is_attached(self, trainer: Any) -> None:
        """Called once when the hook is registered."""

    def before_train(self, trainer: Any) -> None:
        """Called once at the start of ``fit``."""

    def after_train(self, trainer: Any) -> None:
        """Called once at the end of ``fit`` (also when it raised)."""

    def before_train_epoch(self, trainer: Any) -> None:
        """Called at the start of each epoch."""

    def after_train_epoch(self, trainer: Any) -> None:
        """Called at the end of each epoch, after its test pass."""

    def before_train_iter(self, trainer: Any) -> None:
        """Called before each training batch."""

    def after_train_iter(self, trainer: Any, output: Tensor, label: Tensor, loss: Tensor) -> None:
        """Called after each training batch with its output, label and loss."""

    def before_test(self, trainer: Any) -> None:
        """Called when a test pass starts."""

    def after_test(self, trainer: Any) -> None:
        """Called when a test pass ends."""

    def before_test_epoch(self, trainer: Any) -> None:
        """Called before the first test batch."""

    def after_test_epoch(self, trainer: Any) -> None:
        """Called after the last test batch."""

    def before_test_iter(self, trainer: Any) -> None:
        """Called before each test batch."""

    def after_test_iter(self, trainer: Any, output: Tensor, label: Tensor, loss: Tensor) -> None:
        """Called after each test batch with its output, label and loss."""


class BaseHook(_TrainerFirst, _native.BaseHook, metaclass=abc.ABCMeta):  # type: ignore[misc]
    """Colossal-AI's hook base: ember's :class:`~ember.trainer.hooks.BaseHook` with trainer-first methods.

    Its lifecycle methods take the trainer first, as Colossal-AI's do, and do nothing: override
    those you need (a subclass may call ``super().after_train_iter(trainer, ...)``). The
    priority a subclass's constructor is given takes effect even when that constructor never
    calls ``super().__init__``. The hooks of this module are instances of it too.

    Args:
        priority: lower runs first within an event (ints 0-100, or an ember priority name);
            default: the class's ``priority`` (``NORMAL``).
        name: the hook's name in logs and checkpoints (default: the class name).

    Example:
        >>> class LogMessageHook(hooks.BaseHook):
        ...     def __init__(self, priority=10):
        ...         self._logger = get_dist_logger()
        ...     def before_train(self, trainer):
        ...         self._logger.info("training starts")
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> BaseHook:
        hook = super().__new__(cls)
        priority = _bound_priority(cls, args, kwargs)
        if priority is not None:
            hook.priority = get_priority(priority)
        return hook

    def __init__(self, priority: int | str | None = None, name: str | None = None) -> None:
        super().__init__(priority, name)

    def events(self) -> list[str]:
        """The lifecycle methods this hook's class overrides (the no-ops above do not count)."""
        return [e for e in super().events() if getattr(type(self), e) is not getattr(_TrainerFirst, e)]

    def init_runner_states(self, trainer: Any, key: str, val: Any) -> None:
        """Set ``trainer.states[key] = val`` unless it is set (Colossal-AI's shared hook state)."""
        trainer.states.setdefault(key, val)


def _bound_priority(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The ``priority`` the constructor of ``cls`` is called with (its default when not given), or None."""
    try:
        bound = inspect.signature(cls.__init__).bind(None, *args, **kwargs)  # type: ignore[misc]
    except TypeError:  # the constructor itself will say what is wrong
        return None
    bound.apply_defaults()
    return bound.arguments.get("priority")


def _colossal(cls: type[_native.BaseHook]) -> type[_native.BaseHook]:
    """Register a hook of this module as a :class:`BaseHook` (``isinstance`` holds), keeping its own methods."""
    BaseHook.register(cls)
    return cls


@_colossal
class LossHook(_native.LossHook):
    """The mean training and test loss of each epoch (``train/loss``, ``test/loss``).

    Args:
        priority: default 0.

    Example:
        >>> hooks.LossHook()
    """

    def __init__(self, priority: int = 0) -> None:
        super().__init__(priority=priority)


@_colossal
class AccuracyHook(_native.AccuracyHook):
    """Test accuracy (``test/accuracy``): the correct predictions ``accuracy_func`` counts, over the samples.

    Args:
        accuracy_func: ``f(output, label) -> number correct`` (``nn.metric.Accuracy()``);
            default: ember's top-1 count.
        priority: default 0.

    Example:
        >>> hooks.AccuracyHook(accuracy_func=Accuracy())
    """

    def __init__(self, accuracy_func: Callable[[Any, Any], Any] | None = None, priority: int = 0) -> None:
        super().__init__(accuracy_func=accuracy_func, priority=priority)


@_colossal
class MetricHook(_native.MetricHook):
    """ember's metric hook: a per-batch function or a torchmetrics ``Metric``, averaged over samples and ranks.

    Colossal-AI's ``MetricHook(priority)`` is a base class for hooks that share metric objects
    through ``trainer.states``; ember has none such. Give the metric instead, or subclass
    :class:`BaseHook` and record values with ``trainer.record_metric``.

    Args:
        metric: the function ``f(output, label)`` or the Metric.
        name: the metric's name (``test/<name>`` in the history).
        mode: ``"max"`` if higher is better, else ``"min"``.
        on: phases measured (default ``"test"``).
        priority: default 0, like Colossal-AI's metric hooks.

    Example:
        >>> hooks.MetricHook(lambda out, y: (out.argmax(1) == y).float().mean(), "acc")
    """

    def __init__(
        self, metric: Any = None, name: str | None = None, mode: Any = "max", on: Any = ("test",),
        priority: int = 0,
    ) -> None:  # fmt: skip
        if name is None or isinstance(metric, int):
            raise HookError(
                "MetricHook takes the metric and its name (MetricHook(fn, 'acc')): Colossal-AI's MetricHook(priority) "
                "base class has no ember counterpart; subclass hooks.BaseHook and call trainer.record_metric(...)"
            )
        super().__init__(metric, name, mode=mode, on=on, priority=priority)


@_colossal
class LRSchedulerHook(_native.LRSchedulerHook):
    """Steps ``lr_scheduler`` after each epoch (``by_epoch=True``) or each optimizer update.

    Args:
        lr_scheduler: a scheduler over the optimizer given to ``initialize``.
        by_epoch: step per epoch, or per update.
        store_lr_in_state: accepted; ember's logging hooks read the rate from the optimizer.
        priority: default 1: before the logging hooks, which then show the next rate.

    Example:
        >>> hooks.LRSchedulerHook(lr_scheduler=lr_scheduler, by_epoch=True)
    """

    def __init__(self, lr_scheduler: Any, by_epoch: bool, store_lr_in_state: bool = True, priority: int = 1) -> None:
        super().__init__(lr_scheduler, by_epoch, priority=priority)
        self.store_lr_in_state = store_lr_in_state


class _EveryInterval:
    """Colossal-AI's ``interval``: epochs ``0, interval, 2 * interval...`` (0-based) are logged."""

    interval = 1

    def _logs_now(self, trainer: Any) -> bool:
        return trainer.cur_epoch % self.interval == 0


def _interval(owner: str, interval: Any) -> int:
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise HookError(f"{owner}(interval=...) must be a positive int, got {interval!r}")
    return interval


@_colossal
class LogMetricByEpochHook(_native.LogMetricByEpochHook):
    """Logs each epoch's metrics and learning rate on rank 0.

    Args:
        logger: the ``DistributedLogger`` (``get_dist_logger()``).
        interval: log every this many epochs (and the last).
        priority: default 10.

    Example:
        >>> hooks.LogMetricByEpochHook(logger)
    """

    def __init__(self, logger: DistributedLogger | None = None, interval: int = 1, priority: int = 10) -> None:
        super().__init__(logger=logger, interval=interval, priority=priority)


@_colossal
class LogMetricByStepHook(_native.LogMetricByStepHook):
    """Logs the per-step scalars (the loss, the learning rate...) every 50 optimizer updates.

    Colossal-AI's version put them in the progress bar's postfix; ember's progress bar shows
    them anyway (``display_progress=True``) and this hook logs them.

    Args:
        priority: default 10.

    Example:
        >>> hooks.LogMetricByStepHook()
    """

    def __init__(self, priority: int = 10) -> None:
        super().__init__(priority=priority)


@_colossal
class LogMemoryByEpochHook(_EveryInterval, _native.LogMemoryByEpochHook):
    """Logs the process's memory (and CUDA memory on a GPU) after each epoch, on rank 0.

    Args:
        logger: the ``DistributedLogger``.
        interval: log after epochs ``0, interval, ...``.
        priority: default 10.
        log_eval: accepted (ember logs once per epoch, after its test pass).
        report_cpu: accepted (ember always reports the resident set size).

    Example:
        >>> hooks.LogMemoryByEpochHook(logger)
    """

    def __init__(
        self, logger: DistributedLogger | None = None, interval: int = 1, priority: int = 10, log_eval: bool = True,
        report_cpu: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(logger=logger, priority=priority)
        self.interval = _interval("LogMemoryByEpochHook", interval)
        self.log_eval, self.report_cpu = log_eval, report_cpu

    def after_train_epoch(self) -> None:
        """Log on the epochs the interval selects."""
        if self._logs_now(self.trainer):
            super().after_train_epoch()


@_colossal
class LogTimingByEpochHook(_EveryInterval, _native.LogTimingByEpochHook):
    """Logs how long each epoch's training and test pass took, on rank 0.

    Args:
        timer: Colossal-AI's ``MultiTimer``; accepted, ember's hook measures the time itself.
        logger: the ``DistributedLogger``.
        interval: log after epochs ``0, interval, ...``.
        priority: default 10.
        log_eval: include the test pass's time.
        ignore_num_train_steps: accepted (ember logs whole-epoch times, not step means).

    Example:
        >>> hooks.LogTimingByEpochHook(timer, logger)
    """

    def __init__(
        self, timer: Any = None, logger: DistributedLogger | None = None, interval: int = 1, priority: int = 10,
        log_eval: bool = True, ignore_num_train_steps: int = 0,
    ) -> None:  # fmt: skip
        super().__init__(logger=logger, priority=priority)
        self.timer, self.interval = timer, _interval("LogTimingByEpochHook", interval)
        self.log_eval, self.ignore_num_train_steps = log_eval, ignore_num_train_steps

    def after_train_epoch(self) -> None:
        """Log on the epochs the interval selects."""
        if self._logs_now(self.trainer):
            super().after_train_epoch()


@_colossal
class TensorboardHook(_native.TensorboardHook):
    """Writes the per-step scalars and each epoch's metrics to TensorBoard event files in ``log_dir``.

    Args:
        log_dir: the directory.
        ranks: accepted; ember writes from rank 0 (the metrics are already reduced over ranks).
        parallel_mode: accepted, for the same reason.
        priority: default 10.

    Example:
        >>> hooks.TensorboardHook(log_dir="./tb_logs")
    """

    def __init__(
        self, log_dir: str | os.PathLike[str], ranks: list[int] | None = None,
        parallel_mode: ParallelMode = ParallelMode.GLOBAL, priority: int = 10,
    ) -> None:  # fmt: skip
        super().__init__(log_dir, priority=priority)
        self.ranks, self.parallel_mode = ranks, ParallelMode.of(parallel_mode)


@_colossal
class ThroughputHook(_native.ThroughputHook):
    """Measures samples per second and time per update; logs them after each epoch.

    Args:
        ignored_steps: accepted (ember measures in windows of updates, so a slow first step
            weighs little).
        priority: default 10.
        tflop_per_step: not supported (0 only): ember does not count floating-point operations.
        use_local: accepted (ember counts every rank's samples).

    Raises:
        HookError: ``tflop_per_step`` given.

    Example:
        >>> hooks.ThroughputHook()
    """

    def __init__(
        self, ignored_steps: int = 0, priority: int = 10, tflop_per_step: int = 0, use_local: bool = False
    ) -> None:
        if tflop_per_step:
            raise HookError("ThroughputHook(tflop_per_step=...) is not supported by ember: remove it")
        super().__init__(priority=priority)
        self.ignored_steps, self.use_local = ignored_steps, use_local


@_colossal
class SaveCheckpointHook(_native.CheckpointHook):
    """Saves ember's full training state every ``interval`` epochs (or updates) into ``checkpoint_dir``.

    ember's checkpoint (model, optimizer, scheduler, trainer and hook states, random state),
    resumed with ``trainer.fit(..., resume="auto")``; the newest three are kept. See
    ``docs/checkpoint.md``.

    Args:
        interval: epochs (or, with ``save_by_iter``, optimizer updates) between saves.
        checkpoint_dir: the directory.
        model: None or the Engine's model (ember saves the Engine's).
        save_by_iter: count ``interval`` in updates.
        priority: default: after every other hook (Colossal-AI's 10 could save before a later
            hook finished the epoch).

    Raises:
        HookError: no ``checkpoint_dir``; a ``model`` that is not the Engine's.

    Example:
        >>> hooks.SaveCheckpointHook(interval=1, checkpoint_dir="./ckpt")
    """

    def __init__(
        self, interval: int = 1, checkpoint_dir: str | os.PathLike[str] | None = None, model: Any = None,
        save_by_iter: bool = False, priority: int | None = None,
    ) -> None:  # fmt: skip
        if checkpoint_dir is None:
            raise HookError("SaveCheckpointHook needs checkpoint_dir=... (the directory ember saves into)")
        steps, epochs = (interval, None) if save_by_iter else (None, interval)
        super().__init__(checkpoint_dir, every_n_steps=steps, every_n_epochs=epochs, priority=priority)
        self.model = model

    def after_hook_is_attached(self) -> None:
        """Check ``model`` against the Engine's."""
        if self.model is not None and self.model is not self.trainer.engine.model:
            raise HookError(
                "SaveCheckpointHook(model=...) is not the Engine's model: ember saves the Engine's whole state; "
                "leave model out"
            )
        super().after_hook_is_attached()
