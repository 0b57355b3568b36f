"""Colossal-AI's ``colossalai.trainer``: ``Trainer`` and ``hooks``.

``Trainer`` is ember's :class:`ember.trainer.Trainer` with Colossal-AI's constructor
(``Trainer(engine, timer=None, logger=None)``); ``fit`` and ``evaluate`` are ember's, and take
Colossal-AI's arguments as they are.
"""

from __future__ import annotations

from typing import Any

from ember.errors import TrainerError
from ember.logging import DistributedLogger
from ember.trainer import Schedule
from ember.trainer import Trainer as _Trainer

from . import hooks

__all__ = ["Trainer", "hooks"]


class Trainer(_Trainer):
    """ember's Trainer, built as Colossal-AI builds one: ``Trainer(engine, timer=None, logger=None)``.

    Everything else is the native Trainer's: ``fit(train_dataloader, epochs, max_steps,
    test_dataloader, test_interval, hooks, display_progress, return_output_label)``,
    ``evaluate``, ``predict``, ``cur_epoch``, ``cur_step``, ``max_epochs``, ``max_steps``.

    Args:
        engine: from ``colossalai.initialize``.
        timer: Colossal-AI's ``MultiTimer``; kept as :attr:`timer` (ember's timing hooks measure
            time themselves).
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
        super().__init__(engine, logger=logger, schedule=schedule)
        self.timer = timer
        self.states: dict[str, Any] = {}

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
        return super().evaluate(test_dataloader, hooks=hooks, display_progress=display_progress)

    @property
    def steps_per_epoch(self) -> int | None:
        """Batches in an epoch of the training loader of the current (or last) ``fit``."""
        loader = self.train_dataloader
        try:
            return len(loader) if loader is not None else None
        except TypeError:  # a loader without a length
            return None
