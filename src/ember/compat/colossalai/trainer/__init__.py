"""Colossal-AI's ``colossalai.trainer``: ``Trainer`` and ``hooks``.

``Trainer`` is ember's :class:`ember.trainer.Trainer` with Colossal-AI's constructor
(``Trainer(engine, timer=None, logger=None)``); ``fit`` and ``evaluate`` are ember's, and take
Colossal-AI's arguments as they are.
"""

from __future__ import annotations

import inspect
from typing import Any

from ember.errors import TrainerError
from ember.logging import DistributedLogger
from ember.trainer import Schedule
from ember.trainer import Trainer as _Trainer
from ember.trainer.hooks import BaseHook, Priority

from ..timer import MultiTimer
from . import hooks

__all__ = ["Trainer", "hooks"]


class TimerHook(BaseHook):
    """Times the Trainer's epochs and steps through Colossal-AI's ``MultiTimer``, under its names:
    ``Train-epoch``, ``Train-step``, ``Test-epoch``, ``Test-step`` (each kept in the history), as
    Colossal-AI's Trainer does. Runs first at the start of each span and last at its end."""

    def __init__(self, timer: MultiTimer) -> None:
        super().__init__(Priority.HIGHEST, name="colossalai.timer")
        self.timer = timer

    def before_train_epoch(self) -> None:
        """Start ``Train-epoch``."""
        self.timer.start("Train-epoch")

    def before_train_iter(self) -> None:
        """Start ``Train-step``."""
        self.timer.start("Train-step")

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Stop ``Train-step`` (after the update)."""
        self.timer.stop("Train-step", keep_in_history=True)

    def after_train_epoch(self) -> None:
        """Stop ``Train-epoch``."""
        self.timer.stop("Train-epoch", keep_in_history=True)

    def before_test_epoch(self) -> None:
        """Start ``Test-epoch``."""
        self.timer.start("Test-epoch")

    def before_test_iter(self) -> None:
        """Start ``Test-step``."""
        self.timer.start("Test-step")

    def after_test_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Stop ``Test-step``."""
        self.timer.stop("Test-step", keep_in_history=True)

    def after_test_epoch(self) -> None:
        """Stop ``Test-epoch``."""
        self.timer.stop("Test-epoch", keep_in_history=True)


_FIT = inspect.signature(_Trainer.fit)


class Trainer(_Trainer):
    """ember's Trainer, built as Colossal-AI builds one: ``Trainer(engine, timer=None, logger=None)``.

    Everything else is the native Trainer's: ``fit(train_dataloader, epochs, max_steps,
    test_dataloader, test_interval, hooks, display_progress, return_output_label)``,
    ``evaluate``, ``predict``, ``cur_epoch``, ``cur_step``, ``max_epochs``, ``max_steps``.

    Args:
        engine: from ``colossalai.initialize``.
        timer: Colossal-AI's ``MultiTimer``: the Trainer times ``Train-epoch``, ``Train-step``,
            ``Test-epoch`` and ``Test-step`` through it (:class:`TimerHook`); kept as :attr:`timer`.
        logger: the ``DistributedLogger`` the Trainer and the logging hooks write to.
        schedule: how a batch runs (Colossal-AI 0.1.0 took it here); default: ember's, or the
            Engine's pipeline schedule.

    Attributes:
        states: a dict hooks may share values through (Colossal-AI's ``trainer.states``).

    Example:
        >>> trainer = Trainer(engine=engine, logger=logger)
        >>> trainer.fit(train_dataloader=train_dl, epochs=NUM_EPOCHS, test_dataloader=test_dl,
        ...             test_interval=1, hooks=hook_list, display_progress=True)
    """

    def __init__(
        self, engine: Any, timer: Any = None, logger: DistributedLogger | None = None, *,
        schedule: Schedule | None = None,
    ) -> None:  # fmt: skip
        if isinstance(timer, DistributedLogger):
            raise TrainerError("Trainer(engine, timer, logger): the logger was given as the timer; pass logger=...")
        if isinstance(timer, Schedule):
            raise TrainerError("Trainer(engine, timer, logger): a schedule was given as the timer; pass schedule=...")
        if timer is not None and not isinstance(timer, MultiTimer):
            raise TrainerError(f"Trainer(timer=...) takes a colossalai.utils.MultiTimer, got {type(timer).__name__}")
        super().__init__(engine, logger=logger, schedule=schedule)
        self.timer = timer
        self.states: dict[str, Any] = {}
        self._timer_hook = TimerHook(timer) if timer is not None else None
        self._hooks_given: list[Any] = []

    def _with_timer(self, given: Any) -> Any:
        """``given`` hooks (None: those of the last call) with the timer's hook added."""
        chosen = self._hooks_given if given is None else list(given)
        if given is not None:
            self._hooks_given = list(given)
        if self._timer_hook is None or (given is None and not chosen):
            return given if self._timer_hook is None else [self._timer_hook]
        return [*chosen, self._timer_hook] if self._timer_hook not in chosen else chosen

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        """ember's ``fit`` (same arguments), with the ``timer``'s hook among the hooks."""
        bound = _FIT.bind(self, *args, **kwargs)
        bound.arguments["hooks"] = self._with_timer(bound.arguments.get("hooks"))
        return super().fit(*bound.args[1:], **bound.kwargs)

    def evaluate(
        self, test_dataloader: Any, hooks: Any = None, display_progress: bool = False, return_output_label: bool = True
    ) -> dict[str, float]:
        """One test pass (ember's ``evaluate``), with Colossal-AI's ``return_output_label`` accepted.

        Args:
            test_dataloader: the batches.
            hooks: hooks for this call only (None: those of the last ``fit``).
            display_progress: a progress bar on rank 0.
            return_output_label: accepted; hooks receive outputs and labels either way.

        Returns:
            The metrics the hooks recorded (``{"test/accuracy": ...}``).
        """
        chosen = hooks if self._timer_hook is None or hooks is None else [*hooks, self._timer_hook]
        return super().evaluate(test_dataloader, hooks=chosen, display_progress=display_progress)

    @property
    def steps_per_epoch(self) -> int | None:
        """Batches in an epoch of the training loader of the current (or last) ``fit``."""
        loader = self.train_dataloader
        try:
            return len(loader) if loader is not None else None
        except TypeError:  # a loader without a length
            return None
