"""The Trainer: ember's training loop, with everything optional in hooks.

The loop itself is :meth:`Trainer._loop`, :meth:`Trainer._train_epoch` and
:meth:`Trainer._test_epoch` below; ``ember/trainer/hooks/base.py`` shows it as pseudo-code
with the hook events, and ``docs/trainer.md`` explains the state it keeps.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ember import batch as _batch
from ember.batch import batches_per_epoch
from ember.checkpoint.state import set_rng_state
from ember.errors import HookError, TrainerError
from ember.logging import DistributedLogger, get_dist_logger
from ember.trainer._bus import HookBus
from ember.trainer._control import Agreement
from ember.trainer._preempt import preemption_signals
from ember.trainer._resume import check_resume, checkpointers, raise_if_preempted, resume_checkpoint
from ember.trainer._setup import (
    FitPlan,
    check_limits,
    check_test_loader,
    epoch_batches,
    pick_loader,
    real_num_samples,
    warn_if_unsharded,
)
from ember.trainer._state import State, TrainerState
from ember.trainer.hooks.base import BaseHook
from ember.trainer.placeholders import Placeholders, placeholder_values
from ember.trainer.schedule import DefaultSchedule, Schedule, Steps
from ember.trainer.storage import History, StepStorage

if TYPE_CHECKING:
    from torch import nn
    from torch.utils.data import DataLoader

    from ember.engine import Engine

__all__ = ["Trainer"]

_ENGINE_API = ("backward", "step", "zero_grad", "train", "eval", "model", "optimizer", "device",
               "gradient_accumulation", "sync_gradients")  # fmt: skip


class Trainer(TrainerState):
    """Trains an :class:`~ember.engine.Engine` with hooks: ``fit``, ``evaluate``, ``predict``.

    Args:
        engine: from :func:`ember.initialize`. Or leave it out and give ``model``,
            ``optimizer`` and ``criterion``: the Engine is then built from the active config.
        logger: where the Trainer and the logging hooks write (default ``get_dist_logger()``).
        schedule: how one batch runs (see :mod:`ember.trainer.schedule`); default: the one the
            Engine's parallelism needs (pipeline parallelism), else forward, loss, backward
            through :meth:`train_step`.
        model: the model, when no ``engine`` is given.
        optimizer: the optimizer, when no ``engine`` is given.
        criterion: the loss, when no ``engine`` is given (optional if the model returns a loss).
        config: settings for the Engine built here, on top of the launched config.
        stop_check_every_s: with several ranks, the training time between the (overlapped)
            all-reduces in which the ranks agree on a stop, a preemption or an error raised by a
            hook. A request then takes effect on every rank at the same update, within about
            twice this time; 0 checks after every update (a request made in update N takes
            effect after update N+1) at the cost of one all-reduce per update.

    Attributes:
        state: the loop's counters (:class:`~ember.trainer.State`), also readable as
            ``cur_epoch`` (0-based epoch in progress), ``cur_step`` (optimizer updates applied),
            ``epoch_iter``, ``batches_seen`` (``micro_step``, its earlier name) and ``samples_seen``.
        history: per-epoch metrics (:class:`~ember.trainer.storage.History`).
        storage: recent per-step scalars (:class:`~ember.trainer.storage.StepStorage`).
        step_applied: whether the last training batch's ``engine.step()`` updated parameters
            (hooks doing something once per update override ``after_update`` instead).
        history_reset: whether the current (or last) ``fit`` began with ``reset_run_history=True``
            (hooks whose state belongs to the run, like early stopping, start afresh then).
        step_result: the dict the last ``train_step``/``eval_step`` returned.
        placeholder_values: the numbers :class:`~ember.trainer.Placeholders` resolve to.

    Example:
        >>> trainer = Trainer(engine=engine, logger=logger)
        >>> trainer.fit(train_dl, epochs=10, test_dataloader=test_dl, display_progress=True,
        ...             hooks=[hooks.LossHook(), hooks.AccuracyHook(), hooks.LogMetricByEpochHook()])
        >>> trainer.history.best("test/accuracy")
    """

    progress_hook: type[BaseHook] | None = None
    """What ``display_progress=True`` adds to the hooks (unless one of its class is there): the
    :class:`~ember.trainer.hooks.ProgressBarHook`, set by ``ember.trainer``. A subclass may give
    its own (a rich progress display)."""

    def __init__(
        self,
        engine: Engine | None = None,
        logger: DistributedLogger | None = None,
        schedule: Schedule | None = None,
        *,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        criterion: Any = None,
        config: Any = None,
        stop_check_every_s: float = 0.05,
    ) -> None:
        if engine is None:
            if model is None or optimizer is None:
                raise TrainerError("Trainer needs engine=... (from ember.initialize) or model=... and optimizer=...")
            from ember.initializer import initialize

            engine = initialize(model, optimizer, criterion, config=config)[0]
        elif any(x is not None for x in (model, optimizer, criterion, config)):
            raise TrainerError("give Trainer either engine=... or model/optimizer/criterion/config, not both")
        missing = [a for a in _ENGINE_API if not hasattr(engine, a)]
        if missing:
            got = type(engine).__name__
            raise TrainerError(f"Trainer(engine=...) got a {got} without {missing}: build it with ember.initialize")
        if schedule is not None and not isinstance(schedule, Schedule):
            raise TrainerError(f"schedule must have forward_backward() and forward(), got {type(schedule).__name__}")
        self.engine = engine
        self._batches_to_device = engine.device.type != "cpu"  # hooks compare labels with outputs there
        self.logger = logger if logger is not None else get_dist_logger()
        self.schedule: Schedule = (
            schedule if schedule is not None else (_parallel_schedule(engine) or DefaultSchedule())
        )
        self.storage = StepStorage()
        self.state = State()
        self.step_applied, self.history_reset = False, False
        self.step_result: dict[str, Any] = {}
        self.placeholder_values: dict[Placeholders, int] = {}
        self.train_dataloader: Any = None
        self.test_dataloader: Any = None
        self.eval_dataloader: Any = None
        if isinstance(stop_check_every_s, bool) or not isinstance(stop_check_every_s, int | float):
            raise TrainerError(f"stop_check_every_s must be a number of seconds, got {stop_check_every_s!r}")
        if not stop_check_every_s >= 0:
            raise TrainerError(f"stop_check_every_s must be >= 0, got {stop_check_every_s!r}")
        self._agreement = Agreement(self.logger, float(stop_check_every_s))
        self._bus = HookBus(self.logger, self._agreement)
        self._user_hooks: list[BaseHook] = []
        self._progress: BaseHook | None = None
        self._testing = False
        self._test_metrics: dict[str, float] = {}
        self._pending_hook_states: dict[str, Mapping[str, Any]] = {}
        self._pending_strict = True
        # compute_loss is the Engine's criterion, so _forward calls that directly (refreshed each epoch).
        self._criterion_loss = engine.has_criterion and not _overridden(self, "compute_loss")

    # -- public API ---------------------------------------------------------------------------
    def fit(
        self,
        train_dataloader: DataLoader[Any] | Iterable[Any] | None = None,
        epochs: int | None = None,
        max_steps: int | None = None,
        test_dataloader: DataLoader[Any] | None = None,
        test_interval: int = 1,
        hooks: Sequence[BaseHook] | None = None,
        display_progress: bool = False,
        return_output_label: bool = True,
        *,
        train_dataset: Any = None,
        test_dataset: Any = None,
        batch_size: int | None = None,
        dataloader_kwargs: Mapping[str, Any] | None = None,
        reset_run_history: bool = False,
        resume: str | os.PathLike[str] | None = None,
    ) -> History:
        """Train for ``epochs`` epochs and/or ``max_steps`` optimizer updates (first reached wins).

        Both limits count from where this ``fit`` call started, so calling ``fit`` again
        trains that much more and continues the history and counters (unless
        ``reset_run_history``); a state loaded mid-fit (``load_state_dict``, a checkpoint) makes
        the next ``fit`` finish that run instead of starting a new one.

        Args:
            train_dataloader: the training batches (tuples ``(inputs..., label)``, dicts, tensors).
            epochs: epochs to train.
            max_steps: optimizer updates to make (may end mid-epoch).
            test_dataloader: evaluated every ``test_interval`` epochs and after the last one.
            test_interval: epochs between test passes.
            hooks: the hooks for this and later calls (None keeps the current ones).
            display_progress: tqdm bars on rank 0 (adds a :class:`~ember.trainer.hooks.ProgressBarHook`).
            return_output_label: pass outputs and labels to ``after_*_iter`` (False passes None).
            train_dataset: instead of ``train_dataloader``: a dataset, loaded with
                ``ember.get_dataloader(shuffle=True, batch_size=batch_size)``.
            test_dataset: instead of ``test_dataloader``, likewise (not shuffled).
            batch_size: per-rank batch size for the datasets.
            dataloader_kwargs: more ``get_dataloader`` arguments for the datasets.
            reset_run_history: forget the history and counters of earlier ``fit`` calls first.
            resume: ``"auto"`` (the newest checkpoint of the CheckpointHook; none: start fresh) or
                a checkpoint file/directory to continue from; None reads ``$EMBER_RESUME``. With
                a CheckpointHook, SIGTERM/SIGINT save and stop (see ``docs/checkpoint.md``).

        Returns:
            ``self.history``.

        Raises:
            TrainerError: inconsistent arguments; on every rank when a hook raised on one.
            CheckpointError: the checkpoint to resume from cannot be read.
            Preempted: a SystemExit with code 75 after SIGTERM/SIGINT, once the state is saved.
        """
        if self.fitting:
            raise TrainerError("fit was called while fit is running (from a hook?): call it after fit returns")
        epochs, max_steps, test_interval = check_limits(epochs, max_steps, test_interval)
        train_dl = pick_loader("train", train_dataloader, train_dataset, batch_size, True, dataloader_kwargs)
        test_dl = pick_loader("test", test_dataloader, test_dataset, batch_size, False, dataloader_kwargs)
        if train_dl is None:
            raise TrainerError("fit needs train_dataloader=... or train_dataset=... with batch_size=...")
        check_test_loader(test_dl, self.engine.data_parallel_size, self.logger)
        check_resume(resume)
        warn_if_unsharded(train_dl, self.engine.data_parallel_size, self.logger)
        batches = batches_per_epoch(train_dl)
        if batches == 0:
            raise TrainerError(
                "the training dataloader yields no batches (an empty dataset, or drop_last with too few)"
            )
        self._register(hooks, display_progress)  # before anything changes: bad hooks leave the trainer as it was
        self.history_reset = bool(reset_run_history)
        state = self.state
        if reset_run_history:
            state.reset()
            self.storage.clear()
            self.storage.step = 0
        start_epoch, start_step = state.fit_origin()
        self.placeholder_values = placeholder_values(
            epochs, max_steps, batches, self.engine.gradient_accumulation, batches_per_epoch(test_dl)
        )
        self.train_dataloader, self.test_dataloader = train_dl, test_dl
        # a position loaded before fit, in this loader's batches
        state.apply_pending_samples(train_dl, self.engine.data_parallel_size, self.logger)
        state.plan = FitPlan(train_dl, test_dl, epochs, max_steps, test_interval, start_epoch, start_step,
                             return_output_label, resume, self.engine.data_parallel_size)  # fmt: skip
        self.logger.info(self._bus.describe(), ranks=[0])
        self._agreement.reset()
        self._bus.reset()
        state.fitting, state.finished = True, False
        with preemption_signals(self._agreement, self.logger, enabled=bool(checkpointers(self.hooks))):
            try:
                self._loop(state.plan)
            finally:
                state.fitting = False
        raise_if_preempted(self.preempted, self.stop_reason, checkpointers(self.hooks))
        return self.history

    def evaluate(
        self, test_dataloader: DataLoader[Any] | Iterable[Any], hooks: Sequence[BaseHook] | None = None,
        display_progress: bool = False,
    ) -> dict[str, float]:  # fmt: skip
        """Run one test pass and return the metrics the hooks recorded (``{"test/accuracy": ...}``).

        Args:
            test_dataloader: the batches; under several ranks, a sharded loader.
            hooks: hooks for this call only (None: the hooks of the last ``fit``).
            display_progress: show a tqdm bar on rank 0.

        Returns:
            The metrics recorded by metric hooks during this pass (recorded in the history
            too when called from inside ``fit``).
        """
        check_test_loader(test_dataloader, self.engine.data_parallel_size, self.logger)
        if self.fitting and (hooks is not None or display_progress):
            raise TrainerError("evaluate(hooks=...) cannot change the hooks while fit is running")
        saved = self._bus.snapshot()
        if hooks is not None or display_progress:
            self._register(hooks, display_progress, keep=False)
        try:
            metrics = self._test_epoch(test_dataloader)
            self._agreement.agree()
        finally:
            self._bus.restore(saved)
            if not self.fitting:
                self._agreement.reset()
                self._bus.reset()
        return metrics

    @torch.no_grad()
    def predict(self, data: Any) -> Any:
        """Run the model in evaluation mode on a batch, or on every batch of a loader.

        Args:
            data: a tensor, a tuple/list of positional inputs, a dict of keyword inputs, or an
                iterable of batches (a DataLoader: labels are split off as in training).

        Returns:
            The model's output; for a loader the outputs concatenated along the first
            dimension when they are tensors, else a list. Each rank predicts its own shard.

        Example:
            >>> probs = trainer.predict(torch.randn(4, 8)).softmax(-1)
        """
        return _batch.predict(self.engine, data)

    def train_step(self, batch: Any) -> dict[str, Any]:
        """Forward one training batch and compute its loss (override for custom losses).

        Returns:
            ``{"loss": scalar tensor, "output": ..., "label": ..., "batch_size": int}``; extra
            keys are kept in ``trainer.step_result`` for hooks.

        Example:
            >>> class MyTrainer(Trainer):
            ...     def train_step(self, batch):
            ...         x, y = batch
            ...         out = self.engine(x)
            ...         loss = self.engine.criterion(out, y) + 1e-4 * out.pow(2).mean()
            ...         return {"loss": loss, "output": out, "label": y, "batch_size": len(x)}
        """
        return self._forward(batch)

    def update(self) -> bool:
        """Apply the optimizer update if this batch closed an accumulation cycle: ``engine.step()``.

        Called after every training batch's forward and backward pass. Override it to wrap the
        update (call ``super().update()``, or the Engine's ``step``, exactly once); return
        whether the parameters changed, as ``engine.step()`` does.

        Example:
            >>> class EMATrainer(Trainer):
            ...     def update(self):
            ...         applied = super().update()
            ...         if applied:
            ...             ema.update_parameters(self.engine.model)
            ...         return applied
        """
        return self.engine.step()

    def eval_step(self, batch: Any) -> dict[str, Any]:
        """Forward one evaluation batch under ``torch.no_grad()``; same dict as :meth:`train_step`."""
        return self._forward(batch)

    def compute_loss(self, output: Any, label: Any) -> torch.Tensor:
        """The Engine's criterion on ``(output, label)``, or the model's own ``loss`` output."""
        if self.engine.has_criterion:
            return self.engine.criterion(output) if label is None else self.engine.criterion(output, label)
        loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
        if loss is None:
            raise TrainerError(
                "the Engine has no criterion and the model's output has no 'loss': pass criterion= to "
                "ember.initialize, return a loss from the model, or override Trainer.train_step"
            )
        return loss

    def schedule_steps(self) -> Steps:
        """What the schedule is given for each batch: the Engine, :meth:`train_step` and :meth:`eval_step`.

        The loop builds it at each epoch's start (an override made on the instance counts from
        the next epoch). Call it to run a batch through the schedule without the loop.

        Returns:
            A :class:`~ember.trainer.schedule.Steps` holding this trainer's step methods (the
            forward and loss they run by default, where a subclass does not override them).

        Example:
            >>> result = trainer.schedule.forward_backward(trainer.schedule_steps(), batch, boundary=True)
            >>> trainer.engine.step()
        """
        self._criterion_loss = self.engine.has_criterion and not _overridden(self, "compute_loss")
        # Trainer's own train_step/eval_step are _forward: hand that over, one call less per batch.
        train = self._forward if not _overridden(self, "train_step") else self.train_step
        evaluate = self._forward if not _overridden(self, "eval_step") else self.eval_step
        return Steps(self.engine, train, evaluate, type(self).__name__)

    # -- the loop -----------------------------------------------------------------------------
    def _loop(self, run: FitPlan) -> None:
        bus, agreement, completed = self._bus, self._agreement, False
        # before before_train: hooks see their state there
        rng = resume_checkpoint(run.resume, checkpointers(self.hooks), self, self.logger)
        try:
            bus.call("before_train")
            if rng is not None:  # as late as possible: nothing may draw from it before the first batch
                set_rng_state(rng)
            while not agreement.preempted and not agreement.agree() and not run.done(self.state):
                self._train_epoch(run)
            self.state.finished = not agreement.preempted
            bus.call("after_train_loop")  # a preemption's checkpoint, or save_last's, before after_train
            completed = True
        finally:
            self._after_train(completed)

    def _train_epoch(self, run: FitPlan) -> None:
        bus, agreement, engine = self._bus, self._agreement, self.engine
        state = self.state
        start, total = state.epoch_iter, batches_per_epoch(run.train_dataloader)
        batches = epoch_batches(run.train_dataloader, state.epoch, start, self.logger)
        if start == 0:  # a resumed epoch already had its start
            bus.call("before_train_epoch")
        engine.train()
        # Everything that cannot change within the epoch is looked up once, here: this loop runs
        # per batch, and on a tiny model each Python call in it is ~0.1% of the step time.
        forward_backward = functools.partial(self.schedule.forward_backward, self.schedule_steps())
        update = engine.step if not _overridden(self, "update") else self.update
        before, after = bus.handles("before_train_iter"), bus.handles("after_train_iter")
        after_update = bus.handles("after_update")
        keep_outputs, replicas = run.return_output_label, run.replicas
        last_step = run.start_step + run.max_steps if run.max_steps is not None else math.inf
        for batch, last in _batch.mark_last(batches, total, start):
            if before:
                bus.call("before_train_iter")
            result = forward_backward(batch, last)
            self.step_applied = applied = bool(update())
            state.batches_seen += 1
            state.epoch_iter += 1
            state.samples_seen += int(result["batch_size"]) * replicas
            state.step += applied
            self.storage.step, self.step_result = state.step, result
            if engine.step_scalars:  # besides the loss: a MoE's aux loss, dropped tokens
                for name, value in engine.step_scalars.items():
                    self.storage.put_scalar(name, value)
            if after or (applied and after_update):
                if keep_outputs:
                    bus.call_batch_end(applied, result["output"], result["label"], result["loss"])
                else:
                    bus.call_batch_end(applied, None, None, result["loss"])
            if engine.sync_gradients and (
                (agreement.must_agree and agreement.agree(lagged=True)) or state.step >= last_step
            ):
                break
        if agreement.preempted:  # the epoch stays open: the checkpoint resumes inside it
            return
        if not agreement.stopping and run.test_due(self.state):
            self._test_epoch(run.test_dataloader)
        state.closing_epoch = True
        bus.call("after_train_epoch")
        state.epoch, state.epoch_iter, state.closing_epoch = state.epoch + 1, 0, False

    def _test_epoch(self, loader: Iterable[Any]) -> dict[str, float]:
        bus, engine = self._bus, self.engine
        was_training, self._testing, self._test_metrics = engine.training, True, {}
        self.eval_dataloader = loader
        remaining = real_num_samples(loader)  # this rank's samples that are not padding repeats
        keep_outputs = self.state.plan.return_output_label if self.state.plan is not None else True
        steps, forward = self.schedule_steps(), self.schedule.forward
        try:
            bus.call("before_test")
            engine.eval()
            bus.call("before_test_epoch")
            with torch.no_grad():
                for batch in loader:
                    size = _batch.batch_size(batch)
                    keep = size if remaining is None else min(size, remaining)
                    remaining = None if remaining is None else remaining - keep
                    if keep == 0:  # only padding: run it (collectives stay in step), show no hook
                        forward(steps, batch)
                        continue
                    bus.call("before_test_iter")
                    result = forward(steps, batch if keep == size else _batch.trim(batch, keep, size))
                    self.step_result = result
                    bus.call("after_test_iter", *_batch.hook_args(result, keep_outputs))
            bus.call("after_test_epoch")
            bus.call("after_test")
        finally:
            engine.train(was_training)
            self._testing = False
        return dict(self._test_metrics)

    def _after_train(self, completed: bool) -> None:
        error = self._bus.call_all("after_train")
        if not completed:  # an exception is propagating: it is the one to see
            if error is not None:
                self.logger.error(f"after_train also raised {error!r} while training was failing")
            return
        if error is not None:
            self._agreement.fail(error, "after_train")
        self._agreement.agree()

    # -- helpers ------------------------------------------------------------------------------
    def _forward(self, batch: Any) -> dict[str, Any]:
        """:meth:`train_step` and :meth:`eval_step`: the forward pass and the loss."""
        engine = self.engine
        output, label, size = _batch.forward(engine, batch, move=self._batches_to_device)
        if label is not None and self._criterion_loss:  # compute_loss is the Engine's criterion: call it directly
            loss = engine.criterion(output, label)
        else:
            loss = self.compute_loss(output, label)
        return {"loss": loss, "output": output, "label": label, "batch_size": size}

    def _register(self, hooks: Sequence[BaseHook] | None, display_progress: bool, keep: bool = True) -> None:
        if hooks is not None and (isinstance(hooks, BaseHook) or not isinstance(hooks, Sequence)):
            raise HookError(f"hooks must be a list of hooks, got {type(hooks).__name__}")
        chosen = list(self._user_hooks if hooks is None else hooks)
        given = list(chosen)
        if display_progress:
            chosen = self._with_progress(chosen)
        self._bus.register(chosen, self)
        if keep:
            self._user_hooks = given
        self._apply_pending_hook_states()

    def _with_progress(self, chosen: list[BaseHook]) -> list[BaseHook]:
        """``chosen`` with this trainer's :attr:`progress_hook` added, unless one of its kind is there."""
        kind = self.progress_hook
        if kind is None:
            raise TrainerError("display_progress=True, but this Trainer has no progress_hook to add")
        if any(isinstance(h, kind) for h in chosen):
            return chosen
        if not isinstance(self._progress, kind):
            self._progress = kind()
        return [*chosen, self._progress]


def _parallel_schedule(engine: Any) -> Schedule | None:
    """The schedule the Engine's parallelism needs (the pipeline's), or None."""
    return getattr(getattr(engine, "parallel", None), "batch_schedule", None)


def _overridden(trainer: Trainer, method: str) -> bool:
    """Whether ``trainer.<method>`` is not :class:`Trainer`'s own (a subclass or the instance replaced it)."""
    return method in vars(trainer) or getattr(type(trainer), method) is not getattr(Trainer, method)
