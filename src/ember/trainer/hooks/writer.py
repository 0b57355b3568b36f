"""The base of the hooks that write per-step scalars: the step logger, TensorBoard, tracking.

``trainer.storage`` (a :class:`~ember.trainer.storage.StepStorage`) is the one hub of per-step
scalars, as detectron2's ``EventStorage`` is: hooks put values there (``LossHook``:
``train/loss``; ``ThroughputHook``: ``throughput/samples_per_s``, ``time/step_s``,
``time/eta_s``; your own hooks whatever they measure) and every writer reads them from there,
as detectron2's ``EventWriter`` s do. Nothing is measured twice: a writer only reads.

A writer is a :class:`StepWriter`: every ``every_n`` optimizer updates it reads the scalars put
since its own last write, adds the learning rate the update used as ``lr``, and calls
:meth:`StepWriter.write`. To send the scalars somewhere new, subclass it and write ``write``.
"""

from __future__ import annotations

from ember.errors import HookError
from ember.trainer.hooks._util import current_lr
from ember.trainer.hooks.base import BaseHook, Priority
from ember.trainer.storage import Cursor, Reduce

__all__ = ["StepWriter"]


class StepWriter(BaseHook):
    """A hook that writes ``trainer.storage``'s new scalars every ``every_n`` optimizer updates.

    Subclasses implement :meth:`write`; :attr:`reduce` says how a scalar put several times
    since the last write becomes one number: ``"latest"`` (the newest value) or ``"mean"``.
    :meth:`writes_at` may skip a step (a resumed tracking run skips the steps it has).

    Args:
        every_n: optimizer updates between writes.
        priority: default ``BELOW_NORMAL``: after the metric hooks put the update's values,
            before the LR scheduler steps (so ``lr`` is the one the update used).
        name: hook name.
        every_n_arg: the subclass's name for ``every_n``, in the error about a bad value.

    Example:
        >>> class PrintWriter(StepWriter):
        ...     def write(self, step, scalars):
        ...         print(step, scalars)          # 20 {'train/loss': 0.41, 'lr': 0.1}
        >>> trainer.fit(train_dl, epochs=1, hooks=[hooks.LossHook(), PrintWriter(every_n=20)])
    """

    reduce: Reduce = "latest"

    def __init__(
        self, every_n: int, priority: int | str = Priority.BELOW_NORMAL, name: str | None = None, *,
        every_n_arg: str = "every_n",
    ) -> None:  # fmt: skip
        super().__init__(priority, name)
        if isinstance(every_n, bool) or not isinstance(every_n, int) or every_n < 1:
            raise HookError(f"{type(self).__name__}({every_n_arg}=...) must be a positive int, got {every_n!r}")
        self.every_n = every_n
        self._cursor = Cursor()

    def after_update(self) -> None:
        """Write the new scalars on every ``every_n``-th update."""
        step = self.trainer.cur_step
        if step % self.every_n == 0 and self.writes_at(step):
            scalars = self.new_scalars()
            lr = current_lr(self.trainer)
            if lr is not None:
                scalars.setdefault("lr", lr)  # a hook may have put its own "lr": the storage's wins
            self.write(step, scalars)

    def writes_at(self, step: int) -> bool:
        """Whether to write at ``step`` (one of every ``every_n``); True unless a subclass says."""
        return True

    def new_scalars(self) -> dict[str, float]:
        """The scalars put since the last write, each reduced by :attr:`reduce`, in first-put order."""
        return self.trainer.storage.read_new(self._cursor, self.reduce)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """Send ``scalars`` (storage names, and ``lr``) for optimizer update ``step`` somewhere."""
        raise NotImplementedError(f"{type(self).__name__} must implement write(step, scalars)")
