"""Step a learning-rate scheduler on optimizer updates or at epoch ends, never on micro-steps."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ember.errors import HookError
from ember.parallel.optim import shares_param_groups
from ember.trainer.hooks._util import epoch_value
from ember.trainer.hooks.base import BaseHook, Priority
from ember.trainer.placeholders import resolve_partial

__all__ = ["LRSchedulerHook"]


def _is_scheduler(obj: Any) -> bool:
    has = callable(getattr(obj, "step", None)) and callable(getattr(obj, "state_dict", None))
    return has and hasattr(obj, "optimizer")


def _is_plateau(scheduler: Any) -> bool:
    return type(scheduler).__name__ == "ReduceLROnPlateau"


class LRSchedulerHook(BaseHook):
    """Steps ``lr_scheduler`` once per optimizer update, or once per epoch.

    With ``by_epoch=False`` the scheduler steps after every batch whose ``engine.step()``
    updated the parameters: not on the micro-steps of gradient accumulation, not on fp16 steps
    skipped for overflow. With ``by_epoch=True`` it steps at each epoch's end (after the test
    pass, so ``ReduceLROnPlateau`` can watch a test metric through ``monitor``).

    ``lr_scheduler`` may be a scheduler, or a factory called with the optimizer at the start of
    each ``fit`` — typically a ``functools.partial`` holding
    :class:`~ember.trainer.Placeholders`, resolved then from the real dataloader length,
    accumulation and epochs. The built scheduler is :attr:`lr_scheduler`.

    Args:
        lr_scheduler: a torch scheduler over the optimizer given to ``ember.initialize`` (also
            when ZeRO, FSDP2 or tensor parallelism rebuilt it: the user's optimizer is then a
            view of ``engine.optimizer``), or a factory called with ``engine.optimizer``.
        by_epoch: step at epoch ends (True) or on optimizer updates (False).
        monitor: for ``ReduceLROnPlateau``: the history metric it watches (``"test/loss"``).
        priority: default ``LOW``: after logging hooks, so logs show the LR the step used.
        name: hook name.

    Example:
        >>> from functools import partial
        >>> from torch.optim.lr_scheduler import OneCycleLR
        >>> hook = hooks.LRSchedulerHook(partial(OneCycleLR, max_lr=0.1,
        ...                              total_steps=Placeholders.TOTAL_UPDATE_STEPS), by_epoch=False)
    """

    def __init__(
        self,
        lr_scheduler: Any | Callable[[Any], Any],
        by_epoch: bool,
        monitor: str | None = None,
        priority: int | str = Priority.LOW,
        name: str | None = None,
    ) -> None:
        super().__init__(priority, name)
        if not isinstance(by_epoch, bool):
            raise HookError(f"LRSchedulerHook(by_epoch=...) must be True or False, got {by_epoch!r}")
        if not _is_scheduler(lr_scheduler) and not callable(lr_scheduler):
            raise HookError(
                f"LRSchedulerHook needs a torch LR scheduler or a factory (e.g. functools.partial(StepLR, ...)), "
                f"got {type(lr_scheduler).__name__}"
            )
        self.by_epoch, self.monitor = by_epoch, monitor
        self._factory: Callable[[Any], Any] | None = None if _is_scheduler(lr_scheduler) else lr_scheduler
        self.lr_scheduler: Any = lr_scheduler if self._factory is None else None
        self._pending: Mapping[str, Any] | None = None
        if self.lr_scheduler is not None:
            self._check_plateau(self.lr_scheduler)

    def _check_plateau(self, scheduler: Any) -> None:
        if _is_plateau(scheduler) and (self.monitor is None or not self.by_epoch):
            raise HookError(
                "ReduceLROnPlateau watches a metric: use LRSchedulerHook(scheduler, by_epoch=True, "
                "monitor='test/loss') (or another history metric)"
            )

    def before_train(self) -> None:
        """Build the scheduler from the factory (placeholders resolved); check its optimizer."""
        optimizer = self.trainer.engine.optimizer
        if self._factory is not None:
            self.lr_scheduler = resolve_partial(self._factory, self.trainer.placeholder_values)(optimizer)
            if not _is_scheduler(self.lr_scheduler):
                got = type(self.lr_scheduler).__name__
                raise HookError(f"the LRSchedulerHook factory returned {got}, not a scheduler")
            self._check_plateau(self.lr_scheduler)
        if not shares_param_groups(self.lr_scheduler.optimizer, optimizer):
            raise HookError(
                "LRSchedulerHook's scheduler drives a different optimizer than the Trainer's Engine: build it over "
                "the optimizer given to ember.initialize (or over engine.optimizer)"
            )
        if self._pending is not None:
            self.lr_scheduler.load_state_dict(self._pending)
            self._pending = None

    def events(self) -> list[str]:
        """The overridden lifecycle methods; without ``after_update`` when stepping by epoch."""
        return [e for e in super().events() if not (self.by_epoch and e == "after_update")]

    def after_update(self) -> None:
        """Step after each optimizer update (``by_epoch=False``)."""
        if not self.by_epoch:
            self.lr_scheduler.step()

    def after_train_epoch(self) -> None:
        """Step at the epoch's end (``by_epoch=True``); a plateau scheduler gets its metric."""
        if not self.by_epoch:
            return
        if self.monitor is None:
            self.lr_scheduler.step()
            return
        value = epoch_value(self.trainer, self.monitor, "LRSchedulerHook")
        if value is not None:  # None: no test pass this epoch, nothing to compare
            self.lr_scheduler.step(value)

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state (once built, or as loaded and not applied yet)."""
        if self._pending is not None:  # loaded, waiting for the scheduler to be (re)built
            return {"scheduler": self._pending}
        return {} if self.lr_scheduler is None else {"scheduler": self.lr_scheduler.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the scheduler, now or, for a factory not built yet, when it is built."""
        if not state:
            return
        if "scheduler" not in state:
            raise HookError(f"hook {self.name!r}: state has no 'scheduler'; pass what state_dict() returned")
        # A factory's scheduler is rebuilt when fit starts: until then keep the state for it.
        built_for_good = self._factory is None or (self._trainer_ref is not None and self.trainer.fitting)
        if self.lr_scheduler is not None and built_for_good:
            self.lr_scheduler.load_state_dict(state["scheduler"])
        else:
            self._pending = state["scheduler"]
