"""How one batch is run: the piece a pipeline-parallel schedule replaces.

The Trainer hands each batch to its schedule. The default one calls the Trainer's
:meth:`~ember.trainer.Trainer.train_step` (forward and loss, overridable for custom losses)
and the Engine's ``backward``; a schedule that must interleave forward and backward across
micro-batches (pipeline parallelism) implements the same two methods its own way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ember.errors import TrainerError

if TYPE_CHECKING:
    from ember.trainer.trainer import Trainer

__all__ = ["REQUIRED_KEYS", "DefaultSchedule", "Schedule", "check_result"]

REQUIRED_KEYS = ("loss", "output", "label", "batch_size")
"""What a step's result dict must hold (``train_step``, ``eval_step``, a schedule's)."""
_REQUIRED = frozenset(REQUIRED_KEYS)


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
        engine = trainer.engine
        engine.zero_grad()
        if boundary:
            engine.expect_boundary()  # so DDP all-reduces inside this backward
        result = trainer.train_step(batch)
        check_result(result, trainer, "train_step")
        engine.backward(result["loss"], boundary=True if boundary else None)
        return result

    def forward(self, trainer: Trainer, batch: Any) -> dict[str, Any]:
        """See :meth:`Schedule.forward`."""
        result = trainer.eval_step(batch)
        check_result(result, trainer, "eval_step")
        return result


def check_result(result: Any, trainer: Any, method: str) -> None:
    """A step's result must be a dict with loss, output, label and batch_size.

    Args:
        result: what ``trainer.<method>`` returned.
        trainer: the trainer (its class names the step in the message; read only on failure).
        method: ``"train_step"`` or ``"eval_step"``.

    Raises:
        TrainerError: naming the step and the keys it lacks.
    """
    if type(result) is dict and result.keys() >= _REQUIRED:  # per batch: one test, no message built
        return
    where = f"{type(trainer).__name__}.{method}"
    if not isinstance(result, Mapping):
        raise TrainerError(f"{where} must return a dict with {', '.join(REQUIRED_KEYS)}; got {type(result).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in result]
    if missing:
        raise TrainerError(f"{where} returned a dict without {missing}: it needs {', '.join(REQUIRED_KEYS)}")
