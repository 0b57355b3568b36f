"""How one batch is run: the piece a pipeline-parallel schedule replaces.

The Trainer's loop hands each batch to its schedule together with a :class:`Steps`: the Engine
and the two step functions (``train_step`` and ``eval_step``, the forward pass and the loss,
which a Trainer subclass may override). The schedule owns the rest of the batch: the default
one clears the gradients, calls ``steps.train_step`` and back-propagates the loss through the
Engine; a schedule that must interleave forward and backward across micro-batches (pipeline
parallelism) implements the same two methods its own way. A schedule never reaches back into
the Trainer: what it may call is in :class:`Steps`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ember.errors import TrainerError

if TYPE_CHECKING:
    from ember.engine import Engine

__all__ = ["REQUIRED_KEYS", "DefaultSchedule", "Schedule", "StepFn", "Steps", "check_result"]

REQUIRED_KEYS = ("loss", "output", "label", "batch_size")
"""What a step's result dict must hold (``train_step``, ``eval_step``, a schedule's)."""
_REQUIRED = frozenset(REQUIRED_KEYS)

StepFn = Callable[[Any], dict[str, Any]]
"""A step function: one batch in, ``{"loss", "output", "label", "batch_size", ...}`` out."""


@dataclass(frozen=True, slots=True)
class Steps:
    """What a schedule is given to run a batch: the Engine and the step functions.

    The one seam between the loop and a schedule. The Trainer builds it from its own
    :meth:`~ember.trainer.Trainer.train_step` and :meth:`~ember.trainer.Trainer.eval_step`
    (overridden or not), so a schedule calls the user's step without holding the Trainer.

    Attributes:
        engine: the :class:`~ember.engine.Engine` that runs the model, backward and step.
        train_step: forward and loss of one training batch (no backward).
        eval_step: forward and loss of one evaluation batch (called under ``torch.no_grad()``).
        owner: who supplied the step functions, named in errors (``"MyTrainer"``).

    Example:
        >>> steps = Steps(engine, train_step=my_step, eval_step=my_step, owner="my loop")
        >>> result = DefaultSchedule().forward_backward(steps, batch, boundary=False)
        >>> engine.step()
    """

    engine: Engine
    train_step: StepFn
    eval_step: StepFn
    owner: str = "Trainer"


@runtime_checkable
class Schedule(Protocol):
    """What ``Trainer(schedule=...)`` accepts."""

    def forward_backward(self, steps: Steps, batch: Any, boundary: bool) -> dict[str, Any]:
        """Run one training batch through forward and backward (not the optimizer step).

        Args:
            steps: the Engine and the step functions (see :class:`Steps`).
            batch: the batch from the training dataloader.
            boundary: True on the epoch's last batch: the accumulation cycle must close here.

        Returns:
            A dict with at least ``loss``, ``output``, ``label`` and ``batch_size``.
        """
        ...

    def forward(self, steps: Steps, batch: Any) -> dict[str, Any]:
        """Run one evaluation batch (called under ``torch.no_grad()``); same dict as above."""
        ...


class DefaultSchedule:
    """``zero_grad`` → ``steps.train_step(batch)`` → ``engine.backward(loss)``; evaluation:
    ``steps.eval_step(batch)``.
    """

    def forward_backward(self, steps: Steps, batch: Any, boundary: bool) -> dict[str, Any]:
        """See :meth:`Schedule.forward_backward`."""
        engine = steps.engine
        engine.zero_grad()
        if boundary:
            engine.expect_boundary()  # so DDP all-reduces inside this backward
        result = steps.train_step(batch)
        check_result(result, steps.owner, "train_step")
        engine.backward(result["loss"], boundary=True if boundary else None)
        return result

    def forward(self, steps: Steps, batch: Any) -> dict[str, Any]:
        """See :meth:`Schedule.forward`."""
        result = steps.eval_step(batch)
        check_result(result, steps.owner, "eval_step")
        return result


def check_result(result: Any, owner: str, method: str) -> None:
    """A step's result must be a dict with loss, output, label and batch_size.

    Args:
        result: what ``<owner>.<method>`` returned.
        owner: who supplied the step (:attr:`Steps.owner`), for the message.
        method: ``"train_step"`` or ``"eval_step"``.

    Raises:
        TrainerError: naming the step and the keys it lacks.
    """
    if type(result) is dict and result.keys() >= _REQUIRED:  # per batch: one test, no message built
        return
    where = f"{owner}.{method}"
    if not isinstance(result, Mapping):
        raise TrainerError(f"{where} must return a dict with {', '.join(REQUIRED_KEYS)}; got {type(result).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in result]
    if missing:
        raise TrainerError(f"{where} returned a dict without {missing}: it needs {', '.join(REQUIRED_KEYS)}")
