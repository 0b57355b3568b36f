"""Scheduler placeholders: numbers that are only known when ``fit`` starts.

A learning-rate scheduler is often built from the number of optimizer updates the run will
make, which depends on the dataloader's length under the distributed sampler, on gradient
accumulation and on the number of epochs. Write the scheduler as a ``functools.partial`` with
placeholders where those numbers go; :class:`~ember.trainer.hooks.LRSchedulerHook` resolves
them at fit time and builds the scheduler::

    from functools import partial
    from torch.optim.lr_scheduler import OneCycleLR, StepLR
    from ember.trainer import Placeholders as P, hooks

    hooks.LRSchedulerHook(partial(OneCycleLR, max_lr=0.1, total_steps=P.TOTAL_UPDATE_STEPS))
    hooks.LRSchedulerHook(partial(StepLR, step_size=P.NUM_UPDATE_STEPS_PER_EPOCH * 2))

Placeholders combine with ``+``, ``-``, ``*`` and ``//`` (and numbers on either side).
"""

from __future__ import annotations

import enum
import functools
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

from ember.errors import TrainerError

__all__ = ["Expression", "Placeholders", "contains_placeholders", "placeholder_values", "resolve", "resolve_partial"]

_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "//": operator.floordiv,
}


class _Arithmetic:
    """``+ - * //`` on placeholders build an :class:`Expression` evaluated at fit time."""

    def _combine(self, op: str, other: Any, reflected: bool) -> Expression:
        if not isinstance(other, (int, float, _Arithmetic)) or isinstance(other, bool):
            raise TrainerError(
                f"a scheduler placeholder can only be combined with numbers or placeholders, "
                f"got {type(other).__name__} ({other!r})"
            )
        return Expression(op, other, self) if reflected else Expression(op, self, other)

    def __add__(self, other: Any) -> Expression:
        return self._combine("+", other, False)

    def __radd__(self, other: Any) -> Expression:
        return self._combine("+", other, True)

    def __sub__(self, other: Any) -> Expression:
        return self._combine("-", other, False)

    def __rsub__(self, other: Any) -> Expression:
        return self._combine("-", other, True)

    def __mul__(self, other: Any) -> Expression:
        return self._combine("*", other, False)

    def __rmul__(self, other: Any) -> Expression:
        return self._combine("*", other, True)

    def __floordiv__(self, other: Any) -> Expression:
        return self._combine("//", other, False)

    def __rfloordiv__(self, other: Any) -> Expression:
        return self._combine("//", other, True)


class Placeholders(_Arithmetic, enum.Enum):
    """Numbers of the coming run, filled in when ``fit`` starts.

    Attributes:
        NUM_EPOCHS: the ``epochs`` given to ``fit`` (with only ``max_steps``: the epochs those
            steps span, rounded up).
        PER_PROCESS_NUM_UPDATE_STEPS_PER_EPOCH: the same number, by pytorch-accelerated's name
            for it (whose ``NUM_UPDATE_STEPS_PER_EPOCH`` counts every process's updates).
        NUM_UPDATE_STEPS_PER_EPOCH: optimizer updates per epoch on each rank,
            ``ceil(batches per epoch / gradient_accumulation)``; the batches are this rank's
            share under the distributed sampler.
        TOTAL_UPDATE_STEPS: ``NUM_EPOCHS * NUM_UPDATE_STEPS_PER_EPOCH``, or ``max_steps``
            when that comes first.
        TRAIN_DATALOADER_LEN: batches per epoch in the training dataloader, on each rank.
        EVAL_DATALOADER_LEN: batches in the test dataloader given to ``fit``, on each rank.

    Example:
        >>> partial(OneCycleLR, max_lr=0.1, total_steps=Placeholders.TOTAL_UPDATE_STEPS)
    """

    NUM_EPOCHS = "num_epochs"
    NUM_UPDATE_STEPS_PER_EPOCH = "num_update_steps_per_epoch"
    PER_PROCESS_NUM_UPDATE_STEPS_PER_EPOCH = "per_process_num_update_steps_per_epoch"
    TOTAL_UPDATE_STEPS = "total_update_steps"
    TRAIN_DATALOADER_LEN = "train_dataloader_len"
    EVAL_DATALOADER_LEN = "eval_dataloader_len"

    def __repr__(self) -> str:
        return f"Placeholders.{self.name}"

    __str__ = __repr__


class Expression(_Arithmetic):
    """Arithmetic on placeholders, kept unevaluated until :func:`resolve` gets the numbers."""

    def __init__(self, op: str, left: Any, right: Any) -> None:
        self.op, self.left, self.right = op, left, right

    def evaluate(self, values: Mapping[Placeholders, int]) -> Any:
        """The value of this expression with ``values`` substituted."""
        return _OPS[self.op](resolve(self.left, values), resolve(self.right, values))

    def __repr__(self) -> str:
        return f"({self.left!r} {self.op} {self.right!r})"


def contains_placeholders(obj: Any) -> bool:
    """True when ``obj`` is, or contains (lists, tuples, dicts, partials), a placeholder."""
    if isinstance(obj, _Arithmetic):
        return True
    if isinstance(obj, functools.partial):
        return contains_placeholders(obj.args) or contains_placeholders(obj.keywords)
    if isinstance(obj, (list, tuple)):
        return any(contains_placeholders(v) for v in obj)
    if isinstance(obj, dict):
        return any(contains_placeholders(v) for v in obj.values())
    return False


def resolve(obj: Any, values: Mapping[Placeholders, int]) -> Any:
    """Replace every placeholder in ``obj`` (recursing into lists, tuples and dicts).

    Args:
        obj: a value that may be or contain placeholders and expressions.
        values: the number for each placeholder.

    Returns:
        ``obj`` with placeholders replaced; an integral float result becomes an int, so
        ``Placeholders.NUM_EPOCHS * 0.5`` can serve as a ``step_size``.

    Raises:
        TrainerError: a placeholder has no value (e.g. the dataloader has no length).

    Example:
        >>> resolve(Placeholders.NUM_EPOCHS * 2 + 1, {Placeholders.NUM_EPOCHS: 3})
        7
    """
    if isinstance(obj, Placeholders):
        if obj is Placeholders.PER_PROCESS_NUM_UPDATE_STEPS_PER_EPOCH and obj not in values:
            obj = Placeholders.NUM_UPDATE_STEPS_PER_EPOCH  # ember's count is per rank already
        if obj not in values:
            raise TrainerError(f"{obj!r} cannot be resolved for this run: {_why_missing(obj)}")
        return values[obj]
    if isinstance(obj, Expression):
        out = obj.evaluate(values)
        return int(out) if isinstance(out, float) and out.is_integer() else out
    if isinstance(obj, list):
        return [resolve(v, values) for v in obj]
    if isinstance(obj, tuple):
        return tuple(resolve(v, values) for v in obj)
    if isinstance(obj, dict):
        return {k: resolve(v, values) for k, v in obj.items()}
    return obj


def resolve_partial(factory: Callable[..., Any], values: Mapping[Placeholders, int]) -> Callable[..., Any]:
    """Return ``factory`` with the placeholders in its partial arguments replaced by numbers."""
    if not isinstance(factory, functools.partial):
        return factory
    inner = resolve_partial(factory.func, values)
    return functools.partial(inner, *resolve(factory.args, values), **resolve(factory.keywords, values))


def _why_missing(p: Placeholders) -> str:
    if p is Placeholders.NUM_EPOCHS:
        return "fit was given max_steps but the training dataloader has no length"
    if p is Placeholders.EVAL_DATALOADER_LEN:
        return "fit was given no test dataloader, or it has no length"
    return "the training dataloader has no length (an IterableDataset?); give the number yourself"


def placeholder_values(
    epochs: int | None,
    max_steps: int | None,
    batches_per_epoch: int | None,
    accumulation: int,
    eval_batches: int | None = None,
) -> dict[Placeholders, int]:
    """The placeholder numbers of a run (those that can be known; see :class:`Placeholders`)."""
    values: dict[Placeholders, int] = {}
    if eval_batches is not None:
        values[Placeholders.EVAL_DATALOADER_LEN] = eval_batches
    if batches_per_epoch is not None:
        values[Placeholders.TRAIN_DATALOADER_LEN] = batches_per_epoch
        per_epoch = math.ceil(batches_per_epoch / accumulation)
        values[Placeholders.NUM_UPDATE_STEPS_PER_EPOCH] = per_epoch
        if epochs is None and max_steps is not None and per_epoch > 0:
            epochs = math.ceil(max_steps / per_epoch)
        if epochs is not None:
            total = epochs * per_epoch
            values[Placeholders.TOTAL_UPDATE_STEPS] = total if max_steps is None else min(total, max_steps)
    elif max_steps is not None and epochs is None:
        values[Placeholders.TOTAL_UPDATE_STEPS] = max_steps
    if epochs is not None:
        values[Placeholders.NUM_EPOCHS] = epochs
    return values
