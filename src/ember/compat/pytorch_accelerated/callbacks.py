"""pytorch-accelerated's ``callbacks`` module on ember's hooks.

A callback is an object with ``on_*`` methods taking the trainer first; the Trainer calls them
at pytorch-accelerated's events, which it maps onto ember's hook events (see
``docs/migrating.md``). Callbacks may be given as classes (the Trainer instantiates them) and may
be mixed with ember's own hooks (:class:`ember.trainer.hooks.BaseHook` instances), which run at
ember's events. Two built-ins are ember hooks: :class:`ProgressBarCallback` and
:class:`TerminateOnNaNCallback`. :class:`EarlyStoppingCallback` decides with ember's
:class:`~ember.trainer.hooks.EarlyStoppingHook`.

Unlike pytorch-accelerated, an ``on_...`` method whose name is a near-miss of an event
(``on_train_epoch_ends``) is an error, not silently never called.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from torch import nn

from ember.compat._not_provided import module_getattr
from ember.errors import HookError
from ember.trainer import StopTraining, hooks

__all__ = [
    "DEFAULT_EVENTS",
    "CallbackHandler",
    "CallbackMethodNotImplementedError",
    "ConvertSyncBatchNormCallback",
    "EarlyStoppingCallback",
    "LimitBatchesCallback",
    "LimitEvalStepsCallback",
    "LogMetricsCallback",
    "MoveModulesToDeviceCallback",
    "PrintProgressCallback",
    "ProgressBarCallback",
    "SaveBestModelCallback",
    "SaveTrainingStateCallback",
    "StepBasedEvaluationCallback",
    "StopTrainingError",
    "TerminateOnNaNCallback",
    "TrainerCallback",
    "WSDCheckpointCallback",
    "get_default_callbacks",
]

DRIVER_PRIORITY = 45
"""The priority of the ember hook that calls the callbacks' events: after ember's metric hooks
(``ABOVE_NORMAL``, 40), which record the epoch's losses, before early stopping (``NORMAL``, 50)."""

DEFAULT_EVENTS: tuple[str, ...] = (
    "on_init_end",
    "on_training_run_start", "on_training_run_epoch_end", "on_training_run_end",
    "on_train_epoch_start", "on_train_step_start", "on_train_step_end", "on_train_epoch_end",
    "on_eval_epoch_start", "on_eval_step_start", "on_eval_step_end", "on_eval_epoch_end",
    "on_evaluation_run_start", "on_evaluation_run_end",
    "on_stop_training_error",
)  # fmt: skip
"""pytorch-accelerated's events, in the order a training run reaches them."""


class StopTrainingError(StopTraining):
    """Raise from a callback to end the training run.

    The Trainer prints it, calls every callback's ``on_stop_training_error``, skips the rest
    of the epoch's callback events and ends the run (``on_training_run_end`` still runs). With
    several processes every process stops at the same optimizer update (ember's stop agreement).
    """


class CallbackMethodNotImplementedError(Exception):
    """Kept for imports; ember looks events up instead of raising this."""


class TrainerCallback:
    """The base class of callbacks: override the events you need (each takes the trainer first).

    Example:
        >>> class PrintLoss(TrainerCallback):
        ...     def on_train_step_end(self, trainer, batch, batch_output, **kwargs):
        ...         trainer.print(batch_output["loss"].item())
    """

    def on_init_end(self, trainer: Any, **kwargs: Any) -> None:
        """At the end of the Trainer's ``__init__``."""

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        """When ``train`` starts (after the scheduler is built)."""

    def on_train_epoch_start(self, trainer: Any, **kwargs: Any) -> None:
        """At the start of each training epoch."""

    def on_train_step_start(self, trainer: Any, **kwargs: Any) -> None:
        """Before each training batch."""

    def on_train_step_end(self, trainer: Any, batch: Any, batch_output: dict[str, Any], **kwargs: Any) -> None:
        """After each training batch, with what ``calculate_train_batch_loss`` returned."""

    def on_train_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        """After an epoch's training batches (``train_loss_epoch`` is in the run history)."""

    def on_eval_epoch_start(self, trainer: Any, **kwargs: Any) -> None:
        """At the start of an evaluation epoch."""

    def on_eval_step_start(self, trainer: Any, **kwargs: Any) -> None:
        """Before each evaluation batch."""

    def on_eval_step_end(self, trainer: Any, batch: Any, batch_output: dict[str, Any], **kwargs: Any) -> None:
        """After each evaluation batch, with what ``calculate_eval_batch_loss`` returned."""

    def on_eval_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        """After an evaluation epoch (its loss is in the run history)."""

    def on_training_run_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        """After an epoch's training and evaluation."""

    def on_training_run_end(self, trainer: Any, **kwargs: Any) -> None:
        """When ``train`` ends."""

    def on_evaluation_run_start(self, trainer: Any, **kwargs: Any) -> None:
        """When a standalone ``evaluate`` starts."""

    def on_evaluation_run_end(self, trainer: Any, **kwargs: Any) -> None:
        """When a standalone ``evaluate`` ends."""

    def on_stop_training_error(self, trainer: Any, **kwargs: Any) -> None:
        """When a callback raised :class:`StopTrainingError`."""


def _check_callback(callback: Any) -> None:
    """Refuse ``on_...`` methods that are near-misses of an event: they would never be called."""
    for name, _ in inspect.getmembers(type(callback), callable):
        if not name.startswith("on_") or name in DEFAULT_EVENTS:
            continue
        close = difflib.get_close_matches(name, DEFAULT_EVENTS, n=1, cutoff=0.85)
        if close:
            raise HookError(
                f"{type(callback).__name__}.{name} is not a callback event and would never be called: did you "
                f"mean {close[0]!r}? (the events are {', '.join(DEFAULT_EVENTS)})"
            )


class CallbackHandler:
    """The Trainer's callbacks, in the order given; calls their methods for an event.

    Args:
        callbacks: callback instances or classes (instantiated here), and ember hooks.

    Raises:
        HookError: two callbacks of one class, or a method named like a misspelt event.
    """

    def __init__(self, callbacks: Iterable[Any] = ()) -> None:
        self.callbacks: list[Any] = []
        self.add_callbacks(callbacks)

    def add_callbacks(self, callbacks: Iterable[Any]) -> None:
        """Add each of ``callbacks`` (see :meth:`add_callback`)."""
        if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, Iterable):
            raise HookError(f"callbacks must be a list or tuple of callbacks, got {type(callbacks).__name__}")
        for callback in callbacks:
            self.add_callback(callback)

    def add_callback(self, callback: Any) -> None:
        """Add a callback instance, or a callback class to instantiate with no arguments."""
        instance = callback() if isinstance(callback, type) else callback
        if type(instance) in {type(c) for c in self.callbacks}:
            raise HookError(
                f"a {type(instance).__name__} callback was given twice; the callbacks are {self.callback_list}"
            )
        if not isinstance(instance, hooks.BaseHook):
            _check_callback(instance)
        self.callbacks.append(instance)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.callbacks)

    def __len__(self) -> int:
        return len(self.callbacks)

    def clear_callbacks(self) -> None:
        """Remove every callback."""
        self.callbacks = []

    @property
    def callback_list(self) -> list[str]:
        """The callbacks' class names, in order."""
        return [type(c).__name__ for c in self.callbacks]

    @property
    def ember_hooks(self) -> list[hooks.BaseHook]:
        """The callbacks that are ember hooks (they run at ember's events)."""
        return [c for c in self.callbacks if isinstance(c, hooks.BaseHook)]

    def call_event(self, event: str, *args: Any, **kwargs: Any) -> None:
        """Call ``event`` on each callback that has it, in order (ember hooks are skipped)."""
        for callback in self.callbacks:
            method = getattr(callback, event, None)
            if method is not None and not isinstance(callback, hooks.BaseHook):
                method(*args, **kwargs)


def get_default_callbacks(progress_bar: bool = True) -> tuple[type, ...]:
    """The callbacks a Trainer gets by default (without the progress bar if ``progress_bar`` is False)."""
    bar: tuple[type, ...] = (ProgressBarCallback,) if progress_bar else ()
    return (MoveModulesToDeviceCallback, TerminateOnNaNCallback, PrintProgressCallback, *bar, LogMetricsCallback)


class LogMetricsCallback(TrainerCallback):
    """Prints the latest value of each run-history metric: training ones after the training
    epoch, the others after evaluation. Override :meth:`log_metrics` to send them elsewhere."""

    def on_train_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        """Log the metrics whose name contains ``train``."""
        self._log_latest(trainer, [m for m in trainer.run_history.get_metric_names() if "train" in m])

    def on_eval_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        """Log the other metrics."""
        self._log_latest(trainer, [m for m in trainer.run_history.get_metric_names() if "train" not in m])

    def _log_latest(self, trainer: Any, names: Iterable[str]) -> None:
        self.log_metrics(trainer, {name: trainer.run_history.get_latest_metric(name) for name in sorted(names)})

    def log_metrics(self, trainer: Any, metrics: dict[str, Any]) -> None:
        """Print ``metrics`` once per machine."""
        for name, value in metrics.items():
            trainer.print(f"{name}: {value}")


class PrintProgressCallback(TrainerCallback):
    """Prints a line when a run starts and ends, and when each epoch starts."""

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        """Say that training starts."""
        trainer.print("Training run started")

    def on_train_epoch_start(self, trainer: Any, **kwargs: Any) -> None:
        """Say which epoch starts."""
        trainer.print(f"Epoch {trainer.run_history.current_epoch} started")

    def on_training_run_end(self, trainer: Any, **kwargs: Any) -> None:
        """Say that training ended."""
        trainer.print("Training run finished")

    def on_evaluation_run_start(self, trainer: Any, **kwargs: Any) -> None:
        """Say that an evaluation starts."""
        trainer.print("Evaluation run started")

    def on_evaluation_run_end(self, trainer: Any, **kwargs: Any) -> None:
        """Say that the evaluation ended."""
        trainer.print("Evaluation run finished")


class MoveModulesToDeviceCallback(TrainerCallback):
    """Moves every ``nn.Module`` attribute of the Trainer except the model (the loss function,
    a metric module) to the Trainer's device when a run starts."""

    def _move(self, trainer: Any) -> None:
        for name, module in inspect.getmembers(trainer, lambda x: isinstance(x, nn.Module)):
            if name != "model":
                module.to(trainer.device)

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        """Move the modules before training."""
        self._move(trainer)

    def on_evaluation_run_start(self, trainer: Any, **kwargs: Any) -> None:
        """Move the modules before a standalone evaluation."""
        self._move(trainer)


class ProgressBarCallback(hooks.ProgressBarHook):
    """A progress bar per training and evaluation epoch, on the first process: ember's
    :class:`~ember.trainer.hooks.ProgressBarHook`, run just before the callbacks' events so that
    a bar closes before the metrics of its epoch are printed."""

    def __init__(self) -> None:
        super().__init__(priority=DRIVER_PRIORITY - 1)


class TerminateOnNaNCallback(hooks.TerminateOnNaNHook):
    """Stops the run when a training or evaluation loss is NaN or infinite, then exits the
    process with a message, as pytorch-accelerated does. ember's
    :class:`~ember.trainer.hooks.TerminateOnNaNHook` watching both phases; the Trainer exits
    once the run has ended cleanly (after every hook's ``after_train``)."""

    def __init__(self) -> None:
        super().__init__(on=("train", "test"))

    @property
    def triggered(self) -> bool:
        """Whether a non-finite loss stopped the run."""
        return self.reason is not None


class EarlyStoppingCallback(TrainerCallback):
    """Stops training when ``watch_metric`` (a run-history name) has not improved by more than
    ``early_stopping_threshold`` for ``early_stopping_patience`` epochs.

    The decision is ember's :meth:`EarlyStoppingHook.observe <ember.trainer.hooks.EarlyStoppingHook.observe>`.

    Args:
        early_stopping_patience: epochs without improvement to tolerate.
        early_stopping_threshold: the least change that counts as an improvement.
        watch_metric: the run-history metric, e.g. ``"eval_loss_epoch"`` or ``"accuracy"``.
        greater_is_better: whether higher values are better.
        reset_on_train: forget the best value when a new ``train`` call starts.
    """

    def __init__(
        self,
        early_stopping_patience: int = 1,
        early_stopping_threshold: float = 0.01,
        watch_metric: str = "eval_loss_epoch",
        greater_is_better: bool = False,
        reset_on_train: bool = True,
    ) -> None:
        self._stopper = hooks.EarlyStoppingHook(
            monitor=f"run_history/{watch_metric}",
            patience=early_stopping_patience,
            mode="max" if greater_is_better else "min",
            min_delta=early_stopping_threshold,
        )
        self.early_stopping_patience, self.early_stopping_threshold = early_stopping_patience, early_stopping_threshold
        self.watch_metric, self.greater_is_better, self.reset_on_train = watch_metric, greater_is_better, reset_on_train

    @property
    def best_metric(self) -> float | None:
        """The best value seen in this run."""
        return self._stopper.best

    @property
    def early_stopping_patience_counter(self) -> int:
        """Epochs since the last improvement."""
        return self._stopper.wait

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        """Forget the best value (with ``reset_on_train``)."""
        if self.reset_on_train:
            self._stopper.reset()

    def on_training_run_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        """Count this epoch; raise :class:`StopTrainingError` when patience ran out."""
        value = float(trainer.run_history.get_latest_metric(self.watch_metric))
        previous = self._stopper.best
        stop = self._stopper.observe(value, trainer.run_history.current_epoch)
        if previous is not None:
            if self._stopper.wait == 0:
                trainer.print(f"{self.watch_metric} improved by {abs(value - previous):.4g}: patience reset")
            else:
                trainer.print(f"{self.watch_metric} did not improve by more than {self.early_stopping_threshold}")
            trainer.print(f"early stopping patience: {self._stopper.wait}/{self.early_stopping_patience}")
        if stop:
            raise StopTrainingError(
                f"early stopping: {self.watch_metric} did not improve for {self.early_stopping_patience} epoch(s)"
            )

    def state_dict(self) -> dict[str, Any]:
        """The best value and patience count, for ember's checkpoints."""
        return self._stopper.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self._stopper.load_state_dict(state)


class SaveBestModelCallback(TrainerCallback):
    """Saves a checkpoint whenever ``watch_metric`` improves, and loads the best one back
    when the run ends.

    The checkpoint is ``trainer.save_checkpoint``'s: ``torch.load(save_path)["model_state_dict"]``
    reads the weights, as with pytorch-accelerated.

    Args:
        save_path: the checkpoint file.
        watch_metric: the run-history metric compared.
        greater_is_better: whether higher values are better.
        reset_on_train: forget the best value when a new ``train`` call starts.
        save_optimizer: include the optimizer's state.
        save_scheduler: include the scheduler's state.
        load_saved_checkpoint: load the best weights (and optimizer) when the run ends.
    """

    def __init__(
        self,
        save_path: str = "best_model.pt",
        watch_metric: str = "eval_loss_epoch",
        greater_is_better: bool = False,
        reset_on_train: bool = True,
        save_optimizer: bool = True,
        save_scheduler: bool = True,
        load_saved_checkpoint: bool = True,
    ) -> None:
        self.save_path, self.watch_metric, self.greater_is_better = save_path, watch_metric, greater_is_better
        self.reset_on_train, self.load_saved_checkpoint = reset_on_train, load_saved_checkpoint
        self.save_optimizer, self.save_scheduler = save_optimizer, save_scheduler
        self.best_metric: float | None = None
        self.best_metric_epoch: int | None = None

    def _better(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if self.best_metric is None:
            return True
        return value > self.best_metric if self.greater_is_better else value < self.best_metric

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        """Forget the best value (with ``reset_on_train``)."""
        if self.reset_on_train:
            self.best_metric = self.best_metric_epoch = None

    def on_training_run_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        """Save when this epoch's value is the best so far."""
        value = float(trainer.run_history.get_latest_metric(self.watch_metric))
        if self._better(value):
            self.best_metric, self.best_metric_epoch = value, trainer.run_history.current_epoch
            trainer.save_checkpoint(self.save_path, checkpoint_kwargs={self.watch_metric: value},
                                    save_optimizer=self.save_optimizer, save_scheduler=self.save_scheduler)  # fmt: skip

    def on_training_run_end(self, trainer: Any, **kwargs: Any) -> None:
        """Load the best checkpoint (with ``load_saved_checkpoint``)."""
        if not self.load_saved_checkpoint or self.best_metric is None:
            return
        trainer.print(
            f"loading the best checkpoint, {self.watch_metric} {self.best_metric:.4g} at epoch "
            f"{self.best_metric_epoch}, from {str(Path(self.save_path))!r}"
        )
        trainer.load_checkpoint(self.save_path, load_optimizer=self.save_optimizer, load_scheduler=False)

    def state_dict(self) -> dict[str, Any]:
        """The best value and its epoch, for ember's checkpoints."""
        return {"best_metric": self.best_metric, "best_metric_epoch": self.best_metric_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.best_metric, self.best_metric_epoch = state["best_metric"], state["best_metric_epoch"]


from ._more_callbacks import (  # noqa: E402 (they subclass TrainerCallback, defined above)
    ConvertSyncBatchNormCallback,
    LimitBatchesCallback,
    LimitEvalStepsCallback,
    SaveTrainingStateCallback,
    StepBasedEvaluationCallback,
    WSDCheckpointCallback,
)

__getattr__ = module_getattr(__name__, "pytorch_accelerated.callbacks", {
    "ModelEmaCallback": "put ember.trainer.hooks.EMAHook(decay=..., eval_with_ema=True) in the callbacks list",
})  # fmt: skip
