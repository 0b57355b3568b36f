"""The one ember hook that drives pytorch-accelerated's Trainer methods and callback events.

ember's loop runs the batches; this hook, at ember's events, calls the pytorch-accelerated
methods (``train_epoch_start``, ``eval_epoch_end``...) and callback events in
pytorch-accelerated's order. Its priority puts it after ember's metric hooks (so the epoch's
losses are recorded when it reads them) and before early stopping, logging and checkpoints.

pytorch-accelerated evaluates between an epoch's training and its end, where
``on_train_epoch_end`` has already run; ember's loop evaluates before ``after_train_epoch``.
So the Trainer gives ember no test loader: this hook closes the training epoch and then runs
ember's ``evaluate`` itself from ``after_train_epoch``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ember.trainer import Trainer as EmberTrainer
from ember.trainer import hooks

from .callbacks import DRIVER_PRIORITY, StopTrainingError
from .tracking import InMemoryRunHistory, increment_epoch

if TYPE_CHECKING:
    from .trainer import Trainer


class LiveEvalLoader:
    """The evaluation loader as ember's loop sees it: it iterates whatever
    ``trainer.prepared_eval_dataloader()`` is when iteration starts, so a callback may swap it in
    ``on_eval_epoch_start`` as in pytorch-accelerated (``LimitEvalStepsCallback``); other
    attributes are the loader's."""

    def __init__(self, trainer: Trainer) -> None:
        self._trainer = trainer

    def __iter__(self) -> Iterator[Any]:
        return iter(self._trainer.prepared_eval_dataloader())

    def __len__(self) -> int:
        return len(self._trainer.prepared_eval_dataloader())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer.prepared_eval_dataloader(), name)


class CallbackDriver(hooks.BaseHook):
    """Calls the Trainer's pytorch-accelerated methods and its callbacks' events at ember's events."""

    priority = DRIVER_PRIORITY

    def __init__(self) -> None:
        super().__init__(name="pytorch_accelerated")
        self._stopped = False  # a StopTrainingError (or an ember stop) ended the epoch's events
        self._intermediate = False  # an evaluation inside a training epoch (StepBasedEvaluationCallback)

    @contextlib.contextmanager
    def intermediate(self) -> Iterator[None]:
        """Within it, evaluation events say ``is_intermediate=True`` and record ``intermediate_eval_loss``."""
        self._intermediate = True
        try:
            yield
        finally:
            self._intermediate = False

    @property
    def owner(self) -> Trainer:
        """The pytorch-accelerated Trainer."""
        return self.trainer  # type: ignore[return-value]

    # -- dispatch -------------------------------------------------------------------------------
    def _event(self, event: str, **kwargs: Any) -> None:
        """Call ``event`` on the callbacks, unless the run is stopping; handle StopTrainingError."""
        if self._stopped:
            return
        trainer = self.owner
        try:
            trainer.callback_handler.call_event(event, trainer, **kwargs)
        except StopTrainingError as stop:
            self._stop(str(stop) or f"a callback raised StopTrainingError in {event}")

    def _stop(self, reason: str) -> None:
        trainer = self.owner
        self._stopped = True
        trainer.print(reason)
        trainer.callback_handler.call_event("on_stop_training_error", trainer)
        trainer.stop(reason)

    def _stopping(self) -> bool:
        """Whether the run is ending early; an ember stop is announced to the callbacks once."""
        if not self._stopped and self.owner.stop_reason is not None:
            self._stop(self.owner.stop_reason)
        return self._stopped

    # -- training run -------------------------------------------------------------------------------
    def before_train(self) -> None:
        """Build the scheduler, then ``training_run_start`` and ``on_training_run_start``."""
        trainer, self._stopped = self.owner, False
        trainer.scheduler = trainer.create_scheduler() if trainer.create_scheduler_fn is not None else None
        if self._pending_scheduler is not None and trainer.scheduler is not None:
            trainer.scheduler.load_state_dict(self._pending_scheduler)
        self._pending_scheduler = None
        trainer.training_run_start()
        self._event("on_training_run_start")

    _pending_scheduler: Mapping[str, Any] | None = None

    def before_train_epoch(self) -> None:
        """``train_epoch_start`` and ``on_train_epoch_start``."""
        self.owner.train_epoch_start()
        self._event("on_train_epoch_start")

    def before_train_iter(self) -> None:
        """``on_train_step_start``."""
        self._event("on_train_step_start")

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        """``on_train_step_end`` with the batch and what ``calculate_train_batch_loss`` returned."""
        trainer = self.owner
        result = trainer.step_result
        self._event("on_train_step_end", batch=result["batch"], batch_output=result["batch_output"],
                    step=trainer.epoch_iter - 1)  # fmt: skip

    def after_train_epoch(self) -> None:
        """Close the training epoch, evaluate, then close the whole epoch."""
        trainer = self.owner
        if self._stopping():
            return
        trainer.train_epoch_end()
        loss = trainer.history.get("train/loss", trainer.cur_epoch)
        if loss is not None:
            trainer.run_history.update_metric("train_loss_epoch", loss)
        self._event("on_train_epoch_end")
        if trainer.eval_dataset is not None and trainer.prepared_eval_dataloader() is not None and not self._stopped:
            EmberTrainer.evaluate(trainer, LiveEvalLoader(trainer))
        if self._stopping():
            return
        trainer.training_run_epoch_end()
        self._event("on_training_run_epoch_end")
        if not self._stopped:  # as pytorch-accelerated: after the epoch's last event, and not when it stopped the run
            increment_epoch(trainer.run_history)

    def after_train(self) -> None:
        """``training_run_end`` and ``on_training_run_end`` (also after a stop)."""
        trainer, self._stopped = self.owner, False
        trainer.training_run_end()
        self._event("on_training_run_end")

    # -- evaluation -------------------------------------------------------------------------------
    def before_test(self) -> None:
        """A standalone ``evaluate``: ``evaluation_run_start`` and ``on_evaluation_run_start``."""
        trainer = self.owner
        if not trainer.fitting:
            self._stopped = False
            trainer.evaluation_run_start()
            self._event("on_evaluation_run_start")

    def before_test_epoch(self) -> None:
        """``eval_epoch_start`` and ``on_eval_epoch_start``."""
        self.owner.eval_epoch_start()
        self._event("on_eval_epoch_start", **({"is_intermediate": True} if self._intermediate else {}))

    def before_test_iter(self) -> None:
        """``on_eval_step_start``."""
        self._event("on_eval_step_start")

    def after_test_iter(self, output: Any, label: Any, loss: Any) -> None:
        """``on_eval_step_end`` with the batch and what ``calculate_eval_batch_loss`` returned."""
        result = self.owner.step_result
        self._event("on_eval_step_end", batch=result["batch"], batch_output=result["batch_output"])

    def after_test_epoch(self) -> None:
        """``eval_epoch_end``, the epoch's loss into the run history, ``on_eval_epoch_end``."""
        trainer = self.owner
        if self._stopped:
            return
        trainer.eval_epoch_end()
        loss = trainer.test_metrics.get("test/loss")
        name = "intermediate_eval_loss" if self._intermediate else "eval_loss_epoch" if trainer.fitting else \
            "evaluation_loss"  # fmt: skip
        if loss is not None:
            trainer.run_history.update_metric(name, loss)
        self._event("on_eval_epoch_end", **({"is_intermediate": True} if self._intermediate else {}))

    def after_test(self) -> None:
        """A standalone ``evaluate``: ``evaluation_run_end`` and ``on_evaluation_run_end``."""
        trainer = self.owner
        if not trainer.fitting:
            self._stopped = False
            trainer.evaluation_run_end()
            self._event("on_evaluation_run_end")

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The run history (when it is the in-memory one), the scheduler, the callbacks' states."""
        trainer = self.owner
        state: dict[str, Any] = {}
        if isinstance(trainer.run_history, InMemoryRunHistory):
            state["run_history"] = trainer.run_history.state_dict()
        if trainer.scheduler is not None and callable(getattr(trainer.scheduler, "state_dict", None)):
            state["scheduler"] = trainer.scheduler.state_dict()
        callbacks = {
            type(c).__name__: c.state_dict()
            for c in trainer.callback_handler
            if not isinstance(c, hooks.BaseHook) and callable(getattr(c, "state_dict", None))
        }
        if callbacks:
            state["callbacks"] = callbacks
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (the scheduler once it is built)."""
        trainer = self.owner
        if "run_history" in state and isinstance(trainer.run_history, InMemoryRunHistory):
            trainer.run_history.load_state_dict(state["run_history"])
        self._pending_scheduler = state.get("scheduler")
        by_name = {type(c).__name__: c for c in trainer.callback_handler}
        for name, saved in state.get("callbacks", {}).items():
            if name in by_name:
                by_name[name].load_state_dict(saved)
