"""detectron2's and LiBai's ``engine.hooks``: the hooks a trainer needs, with their signatures.

=======================  =================================================================
hook                     what it does here
=======================  =================================================================
``IterationTimer``       puts each iteration's time as ``time``; logs the speed at the end
``LRScheduler``          puts ``lr``, then steps a torch scheduler, every iteration
``PeriodicCheckpointer`` saves ember checkpoints through ember's ``CheckpointHook``
``PeriodicWriter``       calls writers (``CommonMetricPrinter``, ``JSONWriter``) periodically
``EvalHook``             runs an evaluation function every N iterations and at the end
``CallbackHook``         calls the functions it is given
=======================  =================================================================

``PeriodicCheckpointer`` is ember's checkpointing underneath (one format, one writer). The
others do what detectron2's do — once per iteration, in registration order, reading and putting
the EventStorage — which is not what ember's nearest hooks do (``LRSchedulerHook`` steps per
applied update at ``Priority.LOW``, ``ThroughputHook`` measures windows of updates), and they
work alike in both loops (ember's Trainer, and detectron2's loop for a ``run_step`` of one's own).
"""

from __future__ import annotations

import datetime
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ember import distributed
from ember.compat.detectron2.checkpoint import Checkpointer
from ember.compat.detectron2.engine.base import HookBase
from ember.compat.detectron2.utils.events import EventWriter
from ember.errors import HookError
from ember.logging import get_dist_logger
from ember.trainer.hooks import BaseHook, CheckpointHook

__all__ = [
    "BestCheckpointer",
    "CallbackHook",
    "EvalHook",
    "HookBase",
    "IterationTimer",
    "LRScheduler",
    "PeriodicCheckpointer",
    "PeriodicWriter",
]

TrainerFn = Callable[[Any], Any]


def _positive(name: str, value: Any, zero_ok: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero_ok else 1):
        allowed = "an int >= 0" if zero_ok else "a positive int"
        raise HookError(f"{name} must be {allowed}, got {value!r}")
    return value


class CallbackHook(HookBase):
    """A hook made of functions, each called with the trainer.

    Example:
        >>> CallbackHook(after_step=lambda trainer: print(trainer.iter))
    """

    def __init__(
        self, *, before_train: TrainerFn | None = None, after_train: TrainerFn | None = None,
        before_step: TrainerFn | None = None, after_step: TrainerFn | None = None,
    ) -> None:  # fmt: skip
        self._fns = {"before_train": before_train, "after_train": after_train, "before_step": before_step,
                     "after_step": after_step}  # fmt: skip

    def _call(self, event: str) -> None:
        fn = self._fns[event]
        if fn is not None:
            fn(self.trainer)

    def before_train(self) -> None:
        """Call ``before_train(trainer)``."""
        self._call("before_train")

    def after_train(self) -> None:
        """Call ``after_train(trainer)``."""
        self._call("after_train")

    def before_step(self) -> None:
        """Call ``before_step(trainer)``."""
        self._call("before_step")

    def after_step(self) -> None:
        """Call ``after_step(trainer)``."""
        self._call("after_step")


class IterationTimer(HookBase):
    """Time each iteration from this hook's ``before_step`` to its ``after_step`` (register it
    first) into the storage as ``time``; log the speed and the time hooks took at the end.

    Args:
        warmup_iter: the first iterations, left out of the timing.
    """

    def __init__(self, warmup_iter: int = 3) -> None:
        self._warmup = _positive("IterationTimer(warmup_iter=...)", warmup_iter, zero_ok=True)
        self._started = self._step_start = time.perf_counter()
        self._in_steps = 0.0  # seconds inside steps since the warm-up

    def before_train(self) -> None:
        """Start the clocks."""
        self._started, self._in_steps = time.perf_counter(), 0.0

    def before_step(self) -> None:
        """Start timing the iteration."""
        self._step_start = time.perf_counter()

    def after_step(self) -> None:
        """Put the iteration's time (after the warm-up; during it, restart the totals)."""
        now = time.perf_counter()
        done = self.trainer.storage.iter - self.trainer.start_iter + 1
        if done >= self._warmup:
            self.trainer.storage.put_scalars(time=now - self._step_start)
            self._in_steps += now - self._step_start
        else:
            self._started, self._in_steps = now, 0.0

    def after_train(self) -> None:
        """Log the overall speed and the total time."""
        total = time.perf_counter() - self._started
        iterations = self.trainer.storage.iter + 1 - self.trainer.start_iter - self._warmup
        logger = get_dist_logger()
        if iterations > 0 and self._in_steps > 0:
            logger.info(
                f"Overall training speed: {iterations} iterations in {_hms(self._in_steps)} "
                f"({self._in_steps / iterations:.4f} s / it)",
                ranks=[0],
            )
        logger.info(f"Total training time: {_hms(total)} ({_hms(total - self._in_steps)} on hooks)", ranks=[0])


def _hms(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(seconds)))


class LRScheduler(HookBase):
    """Put the learning rate as ``lr``, then step a torch LR scheduler, after every iteration.

    Its state (the scheduler's) goes into checkpoints.

    Args:
        optimizer: whose LR to report; default ``trainer.optimizer``.
        scheduler: a torch LR scheduler; default ``trainer.scheduler``.
    """

    def __init__(self, optimizer: Any = None, scheduler: Any = None) -> None:
        if scheduler is not None:
            _check_scheduler(scheduler)
        self._optimizer, self._scheduler = optimizer, scheduler
        self._group = 0

    @property
    def scheduler(self) -> Any:
        """The scheduler it steps."""
        if self._scheduler is None:
            found = getattr(self.trainer, "scheduler", None)
            if found is None:
                raise HookError("LRScheduler needs scheduler=... (or a trainer with a `scheduler` attribute)")
            self._scheduler = _check_scheduler(found)
        return self._scheduler

    def before_train(self) -> None:
        """Find the optimizer, and the param group whose LR is reported."""
        if self._optimizer is None:
            self._optimizer = getattr(self.trainer, "optimizer", None) or self.scheduler.optimizer
        self._group = _reported_group(self._optimizer)

    def after_step(self) -> None:
        """Put the LR this iteration used, then step."""
        lr = self._optimizer.param_groups[self._group]["lr"]
        self.trainer.storage.put_scalar("lr", lr, smoothing_hint=False)
        self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state."""
        return dict(self.scheduler.state_dict())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the scheduler's state."""
        self.scheduler.load_state_dict(dict(state))


def _check_scheduler(scheduler: Any) -> Any:
    if not (callable(getattr(scheduler, "step", None)) and hasattr(scheduler, "state_dict")):
        raise HookError(
            f"LRScheduler(scheduler=...) takes a torch LR scheduler, got {type(scheduler).__name__} (an fvcore "
            "ParamScheduler: wrap it in torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: sched(i / max_iter)))"
        )
    return scheduler


def _reported_group(optimizer: Any) -> int:
    """The param group whose LR stands for all: the one with most parameters, or, if every group
    has one, the first with the most common LR."""
    groups = optimizer.param_groups
    largest = max(len(g["params"]) for g in groups)
    if largest > 1:
        return next(i for i, g in enumerate(groups) if len(g["params"]) == largest)
    common = Counter(g["lr"] for g in groups).most_common(1)[0][0]
    return next(i for i, g in enumerate(groups) if g["lr"] == common)


class PeriodicWriter(HookBase):
    """Call each writer's ``write()`` every ``period`` iterations and after the last one; close
    them when training ends.

    Args:
        writers: :class:`~ember.compat.detectron2.utils.events.EventWriter` objects.
        period: iterations between writes.
    """

    def __init__(self, writers: Sequence[EventWriter], period: int = 20) -> None:
        for writer in writers:
            if not isinstance(writer, EventWriter):
                raise HookError(f"PeriodicWriter takes EventWriter objects, got {type(writer).__name__}")
        self._writers, self._period = list(writers), _positive("PeriodicWriter(period=...)", period)

    def after_step(self) -> None:
        """Write every ``period`` iterations and at the last one."""
        t = self.trainer
        if (t.iter + 1) % self._period == 0 or t.iter == t.max_iter - 1:
            for writer in self._writers:
                writer.write()

    def after_train(self) -> None:
        """Write what other hooks' ``after_train`` added, then close the writers."""
        for writer in self._writers:
            writer.write()
            writer.close()


class PeriodicCheckpointer(HookBase):
    """Save the whole training state every ``period`` iterations and when training ends.

    The saving is ember's :class:`~ember.trainer.hooks.CheckpointHook` (the ``hook`` attribute): one
    checkpoint format, atomic files named ``ckpt-e<epoch>-s<step>.ckpt`` in the checkpointer's
    ``save_dir`` (``step`` = iterations done), a ``last_checkpoint`` pointer, ``max_to_keep``
    newest kept, a final save when ``train`` ends (also on SIGTERM). It runs after every other
    hook of the step, so a checkpoint holds what they did. Resume with
    ``checkpointer.resume_or_load(...)``.

    Args:
        checkpointer: a :class:`~ember.compat.detectron2.checkpoint.Checkpointer` (its ``save_dir``).
        period: iterations between saves.
        max_iter: accepted for detectron2's signature (the trainer's ``max_iter`` is used).
        max_to_keep: keep only this many newest checkpoints (None: all).
        file_prefix: must stay ``"model"``: ember names its files itself.
    """

    def __init__(
        self, checkpointer: Checkpointer, period: int, max_iter: int | None = None, max_to_keep: int | None = None,
        file_prefix: str = "model",
    ) -> None:  # fmt: skip
        if not isinstance(checkpointer, Checkpointer):
            raise HookError(
                f"PeriodicCheckpointer takes an ember.compat.detectron2.checkpoint.Checkpointer, got "
                f"{type(checkpointer).__name__}"
            )
        if file_prefix != "model":
            raise HookError(
                f"PeriodicCheckpointer(file_prefix={file_prefix!r}): ember names checkpoint files itself "
                "(ckpt-e<epoch>-s<step>.ckpt); leave file_prefix out"
            )
        self.checkpointer, self.period, self.max_iter = checkpointer, period, max_iter
        self.max_to_keep, self.file_prefix = max_to_keep, file_prefix
        self.hook = CheckpointHook(
            checkpointer.save_dir, every_n_steps=period, every_n_epochs=None, keep_last=max_to_keep,
            save_last=True, name="PeriodicCheckpointer",
        )  # fmt: skip

    def before_train(self) -> None:
        """Take the run's ``max_iter``."""
        self.max_iter = self.trainer.max_iter

    def save(self, name: str, **kwargs: Any) -> None:
        """Save now, under ``name`` (see ``Checkpointer.save``)."""
        self.checkpointer.save(name, **kwargs)

    def ember_hooks(self) -> list[BaseHook]:
        return [self.hook]


class BestCheckpointer(HookBase):
    """Save ``<file_prefix>`` through the checkpointer whenever ``val_metric`` (put in the storage
    by an ``EvalHook`` registered before this hook) beats the best so far; NaN and inf never count.

    Args:
        eval_period: the ``EvalHook``'s period (checked after the same iterations, and at the end).
        checkpointer: the :class:`~ember.compat.detectron2.checkpoint.Checkpointer`.
        val_metric: the storage name, e.g. ``"bbox/AP50"``.
        mode: ``"max"`` or ``"min"``.
        file_prefix: the checkpoint's name.
    """

    def __init__(self, eval_period: int, checkpointer: Checkpointer, val_metric: str, mode: str = "max",
                 file_prefix: str = "model_best") -> None:  # fmt: skip
        if mode not in ("max", "min"):
            raise HookError(f"BestCheckpointer(mode={mode!r}): use 'max' or 'min'")
        self._period = _positive("BestCheckpointer(eval_period=...)", eval_period, zero_ok=True)
        self._checkpointer, self._val_metric, self._mode, self._file_prefix = (
            checkpointer,
            val_metric,
            mode,
            file_prefix,
        )
        self.best_metric: float | None = None
        self.best_iter: int | None = None
        self._logger = get_dist_logger()

    def _better(self, value: float) -> bool:
        if math.isnan(value) or math.isinf(value):
            return False
        if self.best_metric is None:
            return True
        return value > self.best_metric if self._mode == "max" else value < self.best_metric

    def _best_checking(self) -> None:
        found = self.trainer.storage.latest().get(self._val_metric)
        if found is None:
            self._logger.warning(f"BestCheckpointer: {self._val_metric!r} is not in the storage; not saving", ranks=[0])
            return
        value, iteration = float(found[0]), int(found[1])
        if not self._better(value):
            self._logger.info(f"not saving: {self._val_metric} {value:.5f} is not better than {self.best_metric}",
                              ranks=[0])  # fmt: skip
            return
        self._checkpointer.save(self._file_prefix, iteration=iteration)
        self.best_metric, self.best_iter = value, iteration
        self._logger.info(f"saved the best model: {self._val_metric} {value:.5f} at iteration {iteration}", ranks=[0])

    def after_step(self) -> None:
        """Check after the evaluation's iterations (not the last: ``after_train`` does)."""
        next_iter = self.trainer.iter + 1
        if self._period > 0 and next_iter % self._period == 0 and next_iter != self.trainer.max_iter:
            self._best_checking()

    def after_train(self) -> None:
        """Check after the final evaluation."""
        if self.trainer.iter + 1 >= self.trainer.max_iter:
            self._best_checking()

    def state_dict(self) -> dict[str, Any]:
        """The best value and its iteration."""
        return {} if self.best_metric is None else {"best_metric": self.best_metric, "best_iter": self.best_iter}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.best_metric, self.best_iter = state.get("best_metric"), state.get("best_iter")


class EvalHook(HookBase):
    """Run ``eval_function()`` every ``eval_period`` iterations and after the last one; put the
    numbers it returns into the storage (nested dicts as ``a/b``).

    Under several processes call it on every rank (it ends with a barrier); give the ranks that
    should not evaluate ``lambda: None``.

    Args:
        eval_period: iterations between evaluations (0: only at the end).
        eval_function: takes nothing, returns a (nested) dict of numbers or None.
        eval_after_train: evaluate after the last iteration (not after a run that failed).
    """

    def __init__(self, eval_period: int, eval_function: Callable[[], Any], eval_after_train: bool = True) -> None:
        if not callable(eval_function):
            raise HookError(f"EvalHook(eval_function=...) must be callable, got {type(eval_function).__name__}")
        self._period = _positive("EvalHook(eval_period=...)", eval_period, zero_ok=True)
        self._func = eval_function
        self._after_train = eval_after_train

    def _evaluate(self) -> None:
        results = self._func()
        if results:
            if not isinstance(results, Mapping):
                raise HookError(f"EvalHook's eval_function must return a dict, got {type(results).__name__}")
            flat = _flatten(results)
            for key, value in flat.items():
                try:
                    flat[key] = float(value)
                except (TypeError, ValueError):
                    raise HookError(
                        f"EvalHook's eval_function returned {key!r}: {value!r}, which is not a number"
                    ) from None
            self.trainer.storage.put_scalars(**flat, smoothing_hint=False)
        distributed.barrier()  # ranks may take different times to evaluate: start the next step together

    def after_step(self) -> None:
        """Evaluate every ``eval_period`` iterations (the last one is left to ``after_train``)."""
        next_iter = self.trainer.iter + 1
        if self._period and next_iter % self._period == 0 and next_iter != self.trainer.max_iter:
            self._evaluate()

    def after_train(self) -> None:
        """Evaluate once more when training finished (not after a run that failed before its end)."""
        if self._after_train and self.trainer.iter + 1 >= self.trainer.max_iter:
            self._evaluate()


def _flatten(results: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in results.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
