"""How one batch is run: the piece a pipeline-parallel schedule replaces.

The Trainer hands each batch to its schedule. The default one calls the Trainer's
:meth:`~ember.trainer.Trainer.train_step` (forward and loss, overridable for custom losses)
and the Engine's ``backward``; a schedule that must interleave forward and backward across
micro-batches (pipeline parallelism) implements the same two methods its own way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ember.trainer._setup import check_result

if TYPE_CHECKING:
    from ember.trainer.trainer import Trainer

__all__ = ["DefaultSchedule", "Schedule"]


@runtime_checkable
class Schedule(Protocol):
    """What ``Trainer(schedule=...)`` accepts."""

    def forward_backward(self, trainer: Trainer, batch: Any, boundary: bool) -> dict[str, Any]:
        """Run one training batch through forward and backward (not the optimizer step).

        Args:
            trainer: the Trainer (its ``engine`` does the work).
            batch: the batch from the training dataloader.
            boundary: True on the epoch's last batch: the accumulation cycle must close here.

        Returns:
            A dict with at least ``loss``, ``output``, ``label`` and ``batch_size``.
        """
        ...

    def forward(self, trainer: Trainer, batch: Any) -> dict[str, Any]:
        """Run one evaluation batch (called under ``torch.no_grad()``); same dict as above."""
        ...


class DefaultSchedule:
    """``zero_grad`` → ``trainer.train_step(batch)`` → ``engine.backward(loss)``; evaluation:
    ``trainer.eval_step(batch)``.
    """

    def forward_backward(self, trainer: Trainer, batch: Any, boundary: bool) -> dict[str, Any]:
        """See :meth:`Schedule.forward_backward`."""
        trainer.engine.zero_grad()
        if boundary:
            trainer.engine.expect_boundary()  # so DDP all-reduces inside this backward
        result = trainer.train_step(batch)
        check_result(result, f"{type(trainer).__name__}.train_step")
        trainer.engine.backward(result["loss"], boundary=True if boundary else None)
        return result

    def forward(self, trainer: Trainer, batch: Any) -> dict[str, Any]:
        """See :meth:`Schedule.forward`."""
        result = trainer.eval_step(batch)
        check_result(result, f"{type(trainer).__name__}.eval_step")
        return result
