"""The Trainer's state: counters, history, stop requests, and what checkpoints save of it."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ember import distributed
from ember.checkpoint.snapshot import Checkpointables, samples_consumed
from ember.errors import TrainerError
from ember.trainer.placeholders import Placeholders
from ember.trainer.storage import History, Mode, Scalar, StepStorage, to_floats

if TYPE_CHECKING:
    from ember.engine import Engine
    from ember.trainer._bus import HookBus
    from ember.trainer._control import Agreement
    from ember.trainer._setup import FitPlan
    from ember.trainer.hooks.base import BaseHook

_STATE_KEYS = ("cur_epoch", "epoch_iter", "cur_step", "micro_step", "samples_seen", "history")


class FitOutcome(NamedTuple):
    """How a ``fit`` ends (:attr:`TrainerState.fit_outcome`)."""

    status: str
    """``"Complete"``, ``"Failed"``, ``"Interrupted"`` or ``"Preempted"``."""
    reason: str | None
    """The error or signal, or None."""


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@dataclass(slots=True)
class State:
    """The run's bookkeeping in one object, as ignite's ``State``: ``trainer.state``.

    The counters, the epoch history, the ``fit`` in progress and what a loaded state left for
    the next ``fit``; :meth:`state_dict`/:meth:`load_state_dict` are the checkpoint's
    ``trainer`` section. Hooks usually read the counters through the trainer
    (``trainer.cur_step``...); the loop alone changes them.

    Attributes:
        epoch: 0-based index of the epoch in progress (= epochs completed between epochs);
            ``trainer.cur_epoch``.
        epoch_iter: training batches processed in the current epoch.
        step: optimizer updates applied (skipped fp16 steps and accumulation micro-steps do
            not count); ``trainer.cur_step``.
        batches_seen: training batches processed, every micro-step counted (not the Engine's
            ``micro_step``, the position in the open accumulation cycle).
        samples_seen: training samples processed by all ranks together (padding included).
        history: the per-epoch metrics (``trainer.history``).
        plan: the current (or last) ``fit``'s plan: loaders, limits, where it started.
        fitting: ``fit`` is running.
        finished: the running ``fit``'s loop ended (its state then describes a finished run).
        closing_epoch: the epoch's end is running (``after_train_epoch``): a state taken now
            describes the next epoch's start.
        pending_origin: where the run a loaded state belongs to started (epoch, step), for the
            next ``fit`` to continue it; None: the next ``fit`` starts a run of its own.
        pending_samples: the samples of the epoch a loaded state had consumed, applied when
            ``fit`` knows its loader.

    Example:
        >>> trainer.state
        State(epoch=2, epoch_iter=0, step=40, batches_seen=160, samples_seen=5120)
    """

    epoch: int = 0
    epoch_iter: int = 0
    step: int = 0
    batches_seen: int = 0
    samples_seen: int = 0
    history: History = field(default_factory=History, repr=False)
    plan: FitPlan | None = field(default=None, repr=False)
    fitting: bool = field(default=False, repr=False)
    finished: bool = field(default=False, repr=False)
    closing_epoch: bool = field(default=False, repr=False)
    pending_origin: tuple[int, int] | None = field(default=None, repr=False)
    pending_samples: int | None = field(default=None, repr=False)

    def reset(self) -> None:
        """Back to the start of a run (``fit(reset_run_history=True)``): counters, history, pending resume."""
        self.epoch = self.epoch_iter = self.step = self.batches_seen = self.samples_seen = 0
        self.history.reset()
        self.pending_origin = self.pending_samples = None

    def position(self) -> tuple[int, int]:
        """``(epoch, batches into it)`` as saved: an epoch that is closing (``after_train_epoch``)
        counts as done, so a resume does not repeat the epoch's end."""
        if self.closing_epoch:
            return self.epoch + 1, 0
        return self.epoch, self.epoch_iter

    def state_dict(self) -> dict[str, Any]:
        """Counters, the run in progress, and the history (the checkpoint's ``trainer`` section)."""
        epoch, epoch_iter = self.position()
        origin = (self.plan.start_epoch, self.plan.start_step) if self.plan is not None else (0, 0)
        return {
            "cur_epoch": epoch,
            "epoch_iter": epoch_iter,
            "cur_step": self.step,
            "micro_step": self.batches_seen,  # its name on disk
            "samples_seen": self.samples_seen,
            "fit": {"active": self.fitting and not self.finished, "start_epoch": origin[0], "start_step": origin[1]},
            "history": self.history.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; the next (or current) ``fit`` continues that run.

        Raises:
            TrainerError: a key is missing.
        """
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise TrainerError(f"trainer state is missing {missing}: pass what Trainer.state_dict() returned")
        self.epoch, self.epoch_iter = int(state["cur_epoch"]), int(state["epoch_iter"])
        self.step, self.batches_seen = int(state["cur_step"]), int(state["micro_step"])
        self.samples_seen = int(state["samples_seen"])
        self.history.load_state_dict(state["history"])
        fit = state.get("fit", {})
        origin = (int(fit.get("start_epoch", 0)), int(fit.get("start_step", 0))) if fit.get("active") else None
        self._continue_run(origin)

    def continue_at(self, step: int) -> None:
        """The run that started at update 0 stands at update ``step``: see :meth:`TrainerState.continue_at`."""
        self.batches_seen = max(0, self.batches_seen + step - self.step)
        self.step = step
        self._continue_run((0, 0))

    def _continue_run(self, origin: tuple[int, int] | None) -> None:
        """The run in progress started at ``origin``: the running ``fit``'s, or the next one's."""
        if self.fitting and self.plan is not None and origin is not None:
            self.plan.start_epoch, self.plan.start_step = origin
        else:
            self.pending_origin = origin

    def fit_origin(self) -> tuple[int, int]:
        """Where the ``fit`` starting now counts from: a loaded run's start, else here."""
        if self.pending_origin is not None:
            origin, self.pending_origin = self.pending_origin, None
            return origin
        self.epoch_iter = 0  # an epoch cut short by an exception is not resumed by a new fit
        return self.epoch, self.step

    def apply_pending_samples(self, loader: Any, data_parallel_size: int, logger: Any) -> None:
        """Resume the epoch after :attr:`pending_samples`, in ``loader``'s batches (no sample skipped)."""
        samples, self.pending_samples = self.pending_samples, None
        if samples is None:
            return
        batch_size = getattr(loader, "batch_size", None)
        if not batch_size:
            logger.warning("cannot tell this loader's batch size: the epoch resumes at the saved batch")
            return
        self.epoch_iter = samples // (batch_size * data_parallel_size)


class TrainerState:
    """Counters, history and run bookkeeping of a :class:`~ember.trainer.Trainer` (its base class)."""

    state: State
    history_reset: bool
    storage: StepStorage
    placeholder_values: dict[Placeholders, int]
    _agreement: Agreement
    _bus: HookBus
    _testing: bool
    _test_metrics: dict[str, float]
    _pending_hook_states: dict[str, Mapping[str, Any]]
    _pending_strict: bool
    train_dataloader: Any
    logger: Any
    engine: Engine

    @property
    def fitting(self) -> bool:
        """Whether ``fit`` is running."""
        return self.state.fitting

    @property
    def history(self) -> History:
        """The per-epoch metrics (:class:`~ember.trainer.storage.History`), kept in :attr:`state`."""
        return self.state.history

    # -- the counters, read from :attr:`state` --------------------------------------------------
    @property
    def cur_epoch(self) -> int:
        """0-based index of the epoch in progress (= epochs completed between epochs)."""
        return self.state.epoch

    @property
    def cur_step(self) -> int:
        """Optimizer updates applied (skipped fp16 steps and accumulation micro-steps do not count)."""
        return self.state.step

    @property
    def epoch_iter(self) -> int:
        """Training batches processed in the current epoch."""
        return self.state.epoch_iter

    @property
    def batches_seen(self) -> int:
        """Training batches processed, every micro-step counted."""
        return self.state.batches_seen

    @property
    def micro_step(self) -> int:
        """:attr:`batches_seen` under its earlier name (programs and tests use it; not the Engine's
        ``micro_step``, the position in the open accumulation cycle)."""
        return self.state.batches_seen

    @property
    def samples_seen(self) -> int:
        """Training samples processed by all ranks together (padding included)."""
        return self.state.samples_seen

    def continue_at(self, step: int) -> None:
        """Make the next ``fit`` continue the run that started at update 0, standing at update ``step``.

        For programs that number their own iterations across ``fit`` calls (detectron2's
        ``train(start_iter, max_iter)``): ``cur_step`` becomes ``step``, ``batches_seen`` moves
        by as much, and the next ``fit(max_steps=N)`` ends at update ``N``, not ``step + N``.
        The epoch, the position in it and the history stay as they are.

        Args:
            step: the optimizer updates the run has made (a checkpoint loaded just before
                usually put ``cur_step`` there already).

        Raises:
            TrainerError: ``step`` is not an int >= 0.

        Example:
            >>> trainer.continue_at(5000)
            >>> trainer.fit(loader, max_steps=90000)   # updates 5000 .. 89999
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise TrainerError(f"continue_at(step) takes an int >= 0, got {step!r}")
        self.state.continue_at(step)
        self.storage.step = step

    def stop(self, reason: str = "") -> None:
        """End training cleanly at the next safe point (after the current optimizer update).

        Every rank stops together even if only one calls this; ``after_train_epoch`` and
        ``after_train`` still run. Hooks may raise :class:`~ember.trainer.StopTraining` instead.
        """
        self._agreement.request_stop(reason or "trainer.stop() was called")

    @property
    def fit_outcome(self) -> FitOutcome:
        """How the ``fit`` that is ending ends, for hooks' ``after_train`` (e.g. a run's final status).

        ``status`` is ``"Failed"`` when an exception is ending ``fit`` or a hook's ``after_train``
        before this one raised, ``"Interrupted"`` for ``KeyboardInterrupt`` (a ``SystemExit`` as
        :func:`ember.track.run.ending_status` says), ``"Preempted"``
        after SIGTERM/SIGINT with a CheckpointHook (the state is saved; ``fit`` raises
        ``Preempted`` next), else ``"Complete"`` (an early stop included); ``reason`` says why.
        A hook whose ``after_train`` runs after this hook's and raises is not seen: the tracking
        hook runs at ``Priority.LOWEST``, after the others.
        """
        from ember.track.run import ending_status  # the one mapping of exceptions to statuses

        exc = sys.exc_info()[1]  # after_train runs in fit's `finally`: the exception ending it
        if exc is not None:
            return FitOutcome(*ending_status(exc))
        if self._bus.ending_error is not None:
            return FitOutcome("Failed", f"after_train raised {_text(self._bus.ending_error)}")
        agreement = self._agreement
        if agreement.preempted:
            return FitOutcome("Preempted", agreement.stop_reason)
        return FitOutcome("Complete", None)

    @property
    def preempted(self) -> bool:
        """Whether the ranks agreed to stop this ``fit`` for a preemption signal (SIGTERM/SIGINT).

        True from that safe point on: the hooks' ``after_train_loop`` (where the CheckpointHook
        saves) and ``after_train`` see it, and ``fit`` then raises
        :class:`~ember.trainer.Preempted`.
        """
        return self._agreement.preempted

    def run_before_next_hook(self, ready: Callable[[], None]) -> None:
        """Call ``ready()`` once, before the next hook method runs (in this event or a later one).

        For work that must end before a hook could change what it reads: the CheckpointHook's
        background copy of an ``async_save`` checkpoint (a hook may change the parameters in place).
        """
        self._bus.hold_until(ready)

    @property
    def stop_reason(self) -> str | None:
        """Why training stopped early, or None."""
        agreement = self._agreement
        return agreement.stop_reason if agreement.stopping or agreement.stop_requested else None

    def record_metric(self, name: str, value: Scalar, mode: Mode | None = None) -> None:
        """Record an epoch-level metric (metric hooks call this at ``after_*_epoch``).

        Inside ``fit`` it goes into :attr:`history` at the current epoch; during a test pass it is
        also returned by :meth:`evaluate`.
        """
        number = to_floats([value])[0] if isinstance(value, torch.Tensor) else float(value)
        if self._testing:
            self._test_metrics[name] = number
        if self.state.fitting:
            self.history.record(name, number, self.state.epoch, mode)

    @property
    def max_epochs(self) -> int | None:
        """The epoch count at which the current (or last) ``fit`` ends, if it has ``epochs``."""
        run = self.state.plan
        return None if run is None or run.epochs is None else run.start_epoch + run.epochs

    @property
    def max_steps(self) -> int | None:
        """The ``cur_step`` at which the current (or last) ``fit`` ends, if it has ``max_steps``."""
        run = self.state.plan
        return None if run is None or run.max_steps is None else run.start_step + run.max_steps

    @property
    def steps_left(self) -> int | None:
        """Optimizer updates left in the current ``fit`` when its length is known, else None."""
        total = self.placeholder_values.get(Placeholders.TOTAL_UPDATE_STEPS)
        plan = self.state.plan
        if total is None or plan is None:
            return None
        return max(0, plan.start_step + total - self.state.step)

    @property
    def test_metrics(self) -> dict[str, float]:
        """The metrics recorded by the last (or current) test pass."""
        return dict(self._test_metrics)

    @property
    def hooks(self) -> tuple[BaseHook, ...]:
        """The registered hooks in the order they run."""
        return tuple(self._bus.hooks)

    def get_hook(self, name: str) -> BaseHook:
        """The registered hook called ``name``."""
        for hook in self._bus.hooks:
            if hook.name == name:
                return hook
        raise TrainerError(f"no hook named {name!r} (registered: {[h.name for h in self._bus.hooks]})")

    @property
    def world_size(self) -> int:
        """Processes in the job."""
        return distributed.world_size()

    # -- state --------------------------------------------------------------------------------
    def checkpointables(self) -> Checkpointables:
        """What a checkpoint saves of this trainer, by section (see :mod:`ember.checkpoint.snapshot`).

        The Engine; the trainer's counters, run and history (:meth:`state_dict`); the hooks'
        states by name; and the position in the training data. ``ember.checkpoint.save`` and
        ``load`` take the trainer for these.
        """
        return Checkpointables(engine=self.engine, counters=self, hooks=_HookStates(self), sampler=_DataPosition(self))

    def state_dict(self) -> dict[str, Any]:
        """Counters, the run in progress, and the history (not the Engine's or the hooks' state):
        :meth:`State.state_dict`.

        Taken while an epoch is closing (``after_train_epoch``) it describes the next epoch's
        start, so a resume does not repeat the epoch's end.
        """
        return self.state.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; the next (or current) ``fit`` continues that run."""
        self.state.load_state_dict(state)
        self.storage.step = self.state.step

    def resume_epoch_at_sample(self, samples: int) -> None:
        """Resume the current epoch after ``samples`` samples that all data-parallel ranks consumed together.

        Converted to this run's batches (``samples // (batch size × data-parallel size)``: no
        sample is skipped) as soon as ``fit`` knows its training loader: now when called
        during ``fit``, else when the next ``fit`` starts. Checkpoints use it, so that a state
        saved by another number of ranks, or with another batch size, resumes at the same sample.
        """
        self.state.pending_samples = int(samples)
        if self.state.fitting:
            self.state.apply_pending_samples(self.train_dataloader, self.engine.data_parallel_size, self.logger)

    def hook_states(self) -> dict[str, dict[str, Any]]:
        """``{hook name: state}`` for every registered hook that keeps state."""
        return {h.name: s for h in self._bus.hooks if (s := h.state_dict())}

    def load_hook_states(self, states: Mapping[str, Mapping[str, Any]], strict: bool = True) -> None:
        """Give each hook its state from :meth:`hook_states`, by name.

        Called before ``fit`` registered the hooks, the states wait and are applied when
        ``fit`` registers hooks with those names.

        Raises:
            TrainerError: with ``strict``, a state whose hook is not registered (checked now
                when hooks are registered, else when ``fit`` registers them).
        """
        self._pending_hook_states, self._pending_strict = dict(states), strict
        if self._bus.hooks:
            self._apply_pending_hook_states()

    def _apply_pending_hook_states(self) -> None:
        states, self._pending_hook_states = self._pending_hook_states, {}
        if not states:
            return
        known = {h.name: h for h in self._bus.hooks}
        unknown = sorted(set(states) - set(known))
        if unknown and self._pending_strict:
            raise TrainerError(
                f"saved state for hooks {unknown}, which are not registered (registered: {sorted(known)})"
            )
        for name, state in states.items():
            if name in known:
                known[name].load_state_dict(state)


class _HookStates:
    """The registered hooks' states by name, as a checkpoint takes them (:class:`~ember.checkpoint.HookStates`)."""

    def __init__(self, trainer: TrainerState) -> None:
        self._trainer = trainer

    def per_rank(self) -> frozenset[str]:
        return frozenset(h.name for h in self._trainer.hooks if h.state_per_rank)

    def state_dict(self, per_rank_only: bool = False) -> dict[str, dict[str, Any]]:
        if not per_rank_only:
            return self._trainer.hook_states()
        return {h.name: s for h in self._trainer.hooks if h.state_per_rank and (s := h.state_dict())}

    def load_state_dict(self, state: Mapping[str, Mapping[str, Any]], strict: bool = True) -> None:
        self._trainer.load_hook_states(state, strict=strict)


class _DataPosition:
    """The training loader's position (the checkpoint's ``sampler`` section) and its resume."""

    def __init__(self, trainer: TrainerState) -> None:
        self._trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        trainer = self._trainer
        epoch, epoch_iter = trainer.state.position()
        loader = trainer.train_dataloader
        sampler = getattr(loader, "sampler", None)
        batch_size = getattr(loader, "batch_size", None)
        return {
            "epoch": epoch,
            "position": None if batch_size is None else epoch_iter * batch_size,
            "batches": epoch_iter,
            "batch_size": batch_size,
            "data_parallel_size": trainer.engine.data_parallel_size,
            "seed": getattr(sampler, "seed", None),
            "shuffle": getattr(sampler, "shuffle", None),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        consumed = samples_consumed(state)
        if consumed is not None:
            self._trainer.resume_epoch_at_sample(consumed)
