"""Colossal-AI's ``colossalai.nn.lr_scheduler``: its schedulers, as torch ``LRScheduler`` classes.

They take Colossal-AI's arguments (``total_steps`` and, for the warmup variants,
``warmup_steps``) and give its learning rates; "step" is whatever the program steps them by
(Colossal-AI's tutorials step ``CosineAnnealingLR(optimizer, total_steps=NUM_EPOCHS)`` once per
epoch). Each learning rate is a closed-form function of ``last_epoch`` (the number of
``step()`` calls), so a scheduler's ``state_dict`` is plain numbers that load back exactly and
nothing depends on a chained inner scheduler, and they work with ``LRSchedulerHook`` and
ember's checkpoints like any torch scheduler. With ``t = last_epoch``, ``T = total_steps``,
``W = warmup_steps`` and each group's initial rate ``base``:

=========================  ===================================================================
scheduler                  learning rate at step ``t``
=========================  ===================================================================
CosineAnnealingLR          ``eta_min + (base - eta_min) * (1 + cos(pi t / T)) / 2``
CosineAnnealingWarmupLR    ``base (t+1)/W`` for ``t < W``, then the cosine over ``t-W`` and ``T-W``
FlatAnnealingLR            ``base`` up to ``F = int(T pct_start)``, then the cosine (to 0) over ``t-F`` and ``T-F``
FlatAnnealingWarmupLR      warmup, flat up to ``W + int((T-W) pct_start)``, then the cosine to ``eta_min``
LinearWarmupLR             ``base (t+1)/(W+1)`` for ``t < W``, then ``base (T-t)/(T-W)`` (not below 0)
MultiStepLR                ``base * gamma ** (milestones <= t)``
MultiStepWarmupLR          warmup, then ``base * gamma ** (milestones in [W, t])``
OneCycleLR                 torch's ``OneCycleLR`` with ``max_lr`` = each group's rate
PolynomialLR               ``(base - end_lr) (1 - min(t, T)/T) ** power + end_lr``
PolynomialWarmupLR         warmup, then the polynomial over ``t-W`` and ``T-W``
StepLR                     ``base * gamma ** (t // step_size)``
ExponentialLR              ``base * gamma ** t``
LambdaLR                   torch's: ``base * lr_lambda(t)``
MultiplicativeLR           torch's: the rate times ``lr_lambda(t)`` at each step
=========================  ===================================================================

Where Colossal-AI took ``**kwargs`` and ignored what it did not know, these raise an
``EngineError`` naming the argument (``CosineAnnealingLR(..., warmup_steps=5)`` points at
``CosineAnnealingWarmupLR``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR as _TorchLambdaLR
from torch.optim.lr_scheduler import LRScheduler
from torch.optim.lr_scheduler import MultiplicativeLR as _TorchMultiplicativeLR
from torch.optim.lr_scheduler import OneCycleLR as _TorchOneCycleLR

from ember.errors import EngineError

__all__ = [
    "CosineAnnealingLR",
    "CosineAnnealingWarmupLR",
    "ExponentialLR",
    "FlatAnnealingLR",
    "FlatAnnealingWarmupLR",
    "LambdaLR",
    "LinearWarmupLR",
    "MultiStepLR",
    "MultiStepWarmupLR",
    "MultiplicativeLR",
    "OneCycleLR",
    "PolynomialLR",
    "PolynomialWarmupLR",
    "StepLR",
]


def _steps(owner: str, name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise EngineError(f"{owner}({name}=...) must be an int >= {minimum}, got {value!r}")
    return value


def _no_extra(owner: str, extra: Mapping[str, Any], hint: str = "") -> None:
    """Colossal-AI's ``**kwargs`` swallowed unknown arguments; ember names them."""
    if extra:
        names = ", ".join(sorted(extra))
        raise EngineError(f"{owner} got argument(s) it does not take: {names}{'; ' + hint if hint else ''}")


def _warmup_split(owner: str, total_steps: Any, warmup_steps: Any) -> tuple[int, int]:
    total = _steps(owner, "total_steps", total_steps, 1)
    warmup = _steps(owner, "warmup_steps", warmup_steps, 0)
    if warmup >= total:
        raise EngineError(f"{owner}: warmup_steps ({warmup}) must be less than total_steps ({total})")
    return total, warmup


def _check_steps(
    scheduler: Any, total_steps: Any, warmup_steps: Any = None, extra: Mapping[str, Any] | None = None, hint: str = ""
) -> None:
    """Set ``scheduler.total_steps`` (and ``warmup_steps`` when given) once checked, and refuse
    the keyword arguments Colossal-AI swallowed (``extra``); errors name the scheduler's class."""
    owner = type(scheduler).__name__
    _no_extra(owner, extra or {}, hint)
    if warmup_steps is None:
        scheduler.total_steps = _steps(owner, "total_steps", total_steps, 1)
    else:
        scheduler.total_steps, scheduler.warmup_steps = _warmup_split(owner, total_steps, warmup_steps)


def _cosine(base: float, eta_min: float, t: int, span: int) -> float:
    return eta_min + (base - eta_min) * (1 + math.cos(math.pi * t / span)) / 2


class _ClosedForm(LRScheduler):
    """A scheduler whose rate is ``self.lr_at(base, last_epoch)``: no state but numbers."""

    total_steps: int

    def get_lr(self) -> list[float | torch.Tensor]:
        """Each group's rate at the current ``last_epoch``."""
        return [self.lr_at(base, self.last_epoch) for base in self.base_lrs]

    def _get_closed_form_lr(self) -> list[float | torch.Tensor]:
        return self.get_lr()

    def lr_at(self, base: Any, t: int) -> Any:
        """The rate of a group whose initial rate is ``base``, after ``t`` steps."""
        raise NotImplementedError


class _Warmup(_ClosedForm):
    """A linear warmup ``base * (t + 1) / W`` for ``t < W``, then :meth:`after` at ``t - W``."""

    warmup_steps = 0

    def lr_at(self, base: Any, t: int) -> Any:
        """The warmup rate, then the schedule after it."""
        if t < self.warmup_steps:
            return base * (t + 1) / self.warmup_steps
        return self.after(base, t - self.warmup_steps)

    def after(self, base: Any, t: int) -> Any:
        """The rate ``t`` steps after the warmup."""
        raise NotImplementedError


class CosineAnnealingLR(_ClosedForm):
    """Cosine annealing from each group's rate to ``eta_min`` over ``total_steps`` steps.

    Args:
        optimizer: the optimizer whose rates it sets.
        total_steps: steps to reach ``eta_min`` (the cosine rises again after them).
        warmup_steps: 0 only; a warmup is :class:`CosineAnnealingWarmupLR`.
        eta_min: the final rate.
        last_epoch: the last step taken (-1: start).

    Example:
        >>> lr_scheduler = CosineAnnealingLR(optimizer, total_steps=gpc.config.NUM_EPOCHS)  # stepped per epoch
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0, eta_min: float = 0,
        last_epoch: int = -1, **kwargs: Any,
    ) -> None:  # fmt: skip
        _no_extra("CosineAnnealingLR", kwargs)
        if warmup_steps:
            raise EngineError(
                f"CosineAnnealingLR has no warmup (Colossal-AI ignored warmup_steps={warmup_steps!r}): use "
                f"CosineAnnealingWarmupLR(optimizer, total_steps, warmup_steps={warmup_steps!r})"
            )
        _check_steps(self, total_steps)
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base: Any, t: int) -> Any:
        """``eta_min + (base - eta_min) * (1 + cos(pi t / T)) / 2``."""
        return _cosine(base, self.eta_min, t, self.total_steps)


class CosineAnnealingWarmupLR(_Warmup):
    """A linear warmup over ``warmup_steps``, then cosine annealing to ``eta_min`` at ``total_steps``.

    Args:
        optimizer: the optimizer whose rates it sets.
        total_steps: steps in all (warmup included).
        warmup_steps: steps of linear warmup, reaching each group's rate at step ``W - 1``.
        eta_min: the final rate.
        last_epoch: the last step taken (-1: start).

    Example:
        >>> CosineAnnealingWarmupLR(optimizer, total_steps=1000, warmup_steps=50)
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0, eta_min: float = 0.0,
        last_epoch: int = -1,
    ) -> None:  # fmt: skip
        _check_steps(self, total_steps, warmup_steps)
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def after(self, base: Any, t: int) -> Any:
        """The cosine over ``T - W`` steps."""
        return _cosine(base, self.eta_min, t, self.total_steps - self.warmup_steps)


def _flat_split(owner: str, steps: int, pct_start: Any) -> tuple[int, int]:
    if isinstance(pct_start, bool) or not isinstance(pct_start, int | float) or not 0.0 <= pct_start <= 1.0:
        raise EngineError(f"{owner}(pct_start=...) must be a fraction in [0, 1], got {pct_start!r}")
    flat = int(steps * pct_start)
    if flat >= steps:
        raise EngineError(f"{owner}: pct_start={pct_start!r} leaves no step to anneal over: lower it below 1")
    return flat, steps - flat


class FlatAnnealingLR(_ClosedForm):
    """Each group's rate for the first ``int(total_steps * pct_start)`` steps, then cosine annealing to 0.

    Args:
        optimizer: the optimizer whose rates it sets.
        total_steps: steps in all.
        pct_start: the flat fraction.
        last_epoch: the last step taken (-1: start).

    Example:
        >>> FlatAnnealingLR(optimizer, total_steps=100, pct_start=0.5)
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_steps: int, pct_start: float = 0.72, last_epoch: int = -1,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        _check_steps(self, total_steps, extra=kwargs, hint="FlatAnnealingWarmupLR takes warmup_steps and eta_min")
        self.flat_steps, self.anneal_steps = _flat_split("FlatAnnealingLR", self.total_steps, pct_start)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base: Any, t: int) -> Any:
        """``base`` while flat, then the cosine to 0."""
        return base if t <= self.flat_steps else _cosine(base, 0.0, t - self.flat_steps, self.anneal_steps)


class FlatAnnealingWarmupLR(_Warmup):
    """A linear warmup, a flat stretch (``pct_start`` of the rest), then cosine annealing to ``eta_min``.

    Args:
        optimizer: the optimizer whose rates it sets.
        total_steps: steps in all.
        warmup_steps: steps of linear warmup.
        pct_start: the flat fraction of the steps after the warmup.
        eta_min: the final rate.
        last_epoch: the last step taken (-1: start).

    Example:
        >>> FlatAnnealingWarmupLR(optimizer, total_steps=100, warmup_steps=10, pct_start=0.5)
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0, pct_start: float = 0.72,
        eta_min: float = 0, last_epoch: int = -1, **kwargs: Any,
    ) -> None:  # fmt: skip
        _check_steps(self, total_steps, warmup_steps, kwargs)
        rest = self.total_steps - self.warmup_steps
        self.flat_steps, self.anneal_steps = _flat_split("FlatAnnealingWarmupLR", rest, pct_start)
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def after(self, base: Any, t: int) -> Any:
        """``base`` while flat, then the cosine to ``eta_min``."""
        if t <= self.flat_steps:
            return base
        return _cosine(base, self.eta_min, t - self.flat_steps, self.anneal_steps)


class LinearWarmupLR(_ClosedForm):
    """Linear warmup to each group's rate, then linear decay to 0 at ``total_steps``.

    The warmup reaches ``base * W / (W + 1)`` at step ``W - 1`` and the decay starts from
    ``base`` at step ``W``, as in Colossal-AI; after ``total_steps`` the rate stays 0 (Colossal-AI's
    went negative).

    Args:
        optimizer: the optimizer whose rates it sets.
        total_steps: the step at which the rate reaches 0.
        warmup_steps: steps of warmup.
        last_epoch: the last step taken (-1: start).

    Example:
        >>> LinearWarmupLR(optimizer, total_steps=1000, warmup_steps=100)
    """

    warmup_steps: int

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0, last_epoch: int = -1,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        _check_steps(self, total_steps, warmup_steps, kwargs)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base: Any, t: int) -> Any:
        """``base (t+1)/(W+1)``, then ``base (T-t)/(T-W)``, not below 0."""
        if t < self.warmup_steps:
            return base * (t + 1) / (self.warmup_steps + 1)
        return base * max(0, self.total_steps - t) / (self.total_steps - self.warmup_steps)


def _milestones(owner: str, milestones: Any) -> list[int]:
    if not isinstance(milestones, Iterable) or isinstance(milestones, str | bytes):
        raise EngineError(f"{owner} needs milestones=[step, ...] (the steps at which the rate is multiplied by gamma)")
    values = list(milestones)
    if not values or any(isinstance(m, bool) or not isinstance(m, int) or m < 0 for m in values):
        raise EngineError(f"{owner}(milestones=...) must be a non-empty list of step numbers >= 0, got {milestones!r}")
    return sorted(values)


class MultiStepLR(_ClosedForm):
    """Each group's rate times ``gamma`` for every milestone reached.

    Args:
        optimizer: the optimizer whose rates it sets.
        total_steps: the run's length (Colossal-AI's signature; not used by the formula).
        milestones: the steps at which the rate is multiplied by ``gamma``.
        gamma: the factor.
        last_epoch: the last step taken (-1: start).

    Example:
        >>> MultiStepLR(optimizer, total_steps=90, milestones=[30, 60], gamma=0.1)
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_steps: int, milestones: list[int] | None = None,
        gamma: float = 0.1, last_epoch: int = -1, **kwargs: Any,
    ) -> None:  # fmt: skip
        _check_steps(self, total_steps, extra=kwargs, hint="MultiStepWarmupLR takes warmup_steps")
        self.milestones, self.gamma = _milestones("MultiStepLR", milestones), gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base: Any, t: int) -> Any:
        """``base * gamma ** (number of milestones <= t)``."""
        return base * self.gamma ** bisect.bisect_right(self.milestones, t)


class MultiStepWarmupLR(_Warmup):
    """A linear warmup, then each group's rate times ``gamma`` for every milestone reached.

    Milestones inside the warmup do not count, as in Colossal-AI.

    Args:
        optimizer: the optimizer whose rates it sets.
        total_steps: steps in all.
        warmup_steps: steps of linear warmup.
        milestones: the steps (counted from the start) at which the rate is multiplied by ``gamma``.
        gamma: the factor.
        last_epoch: the last step taken (-1: start).

    Example:
        >>> MultiStepWarmupLR(optimizer, total_steps=90, warmup_steps=5, milestones=[30, 60])
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0,
        milestones: list[int] | None = None, gamma: float = 0.1, last_epoch: int = -1, **kwargs: Any,
    ) -> None:  # fmt: skip
        _check_steps(self, total_steps, warmup_steps, kwargs)
        given = _milestones("MultiStepWarmupLR", milestones)
        self.milestones, self.gamma = [m - self.warmup_steps for m in given if m >= self.warmup_steps], gamma
        super().__init__(optimizer, last_epoch)

    def after(self, base: Any, t: int) -> Any:
        """``base * gamma ** (number of milestones in [W, W + t])``."""
        return base * self.gamma ** bisect.bisect_right(self.milestones, t)


class PolynomialLR(_ClosedForm):
    """Polynomial decay from each group's rate to ``end_lr`` at ``total_steps``.

    Args:
        optimizer: the optimizer whose rates it sets.
        total_steps: the step at which the rate reaches ``end_lr`` (and stays).
        end_lr: the final rate.
        power: the polynomial's power (1: linear).
        last_epoch: the last step taken (-1: start).

    Example:
        >>> PolynomialLR(optimizer, total_steps=1000, end_lr=1e-5, power=2.0)
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_steps: int, end_lr: float = 0.0001, power: float = 1.0,
        last_epoch: int = -1, **kwargs: Any,
    ) -> None:  # fmt: skip
        _check_steps(self, total_steps, extra=kwargs, hint="PolynomialWarmupLR takes warmup_steps")
        self.end_lr, self.power = _end_lr("PolynomialLR", end_lr), power
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base: Any, t: int) -> Any:
        """``(base - end_lr) (1 - min(t, T)/T) ** power + end_lr``."""
        return _poly(base, self.end_lr, self.power, t, self.total_steps)


class PolynomialWarmupLR(_Warmup):
    """A linear warmup, then polynomial decay to ``end_lr`` at ``total_steps``.

    Args:
        optimizer: the optimizer whose rates it sets.
        total_steps: steps in all.
        warmup_steps: steps of linear warmup.
        end_lr: the final rate.
        power: the polynomial's power.
        last_epoch: the last step taken (-1: start).

    Example:
        >>> PolynomialWarmupLR(optimizer, total_steps=1000, warmup_steps=100)
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0, end_lr: float = 0.0001,
        power: float = 1.0, last_epoch: int = -1, **kwargs: Any,
    ) -> None:  # fmt: skip
        _check_steps(self, total_steps, warmup_steps, kwargs)
        self.end_lr, self.power = _end_lr("PolynomialWarmupLR", end_lr), power
        super().__init__(optimizer, last_epoch)

    def after(self, base: Any, t: int) -> Any:
        """The polynomial over ``T - W`` steps."""
        return _poly(base, self.end_lr, self.power, t, self.total_steps - self.warmup_steps)


def _end_lr(owner: str, end_lr: Any) -> float:
    if isinstance(end_lr, bool) or not isinstance(end_lr, int | float) or end_lr < 0:
        raise EngineError(f"{owner}(end_lr=...) must be a number >= 0, got {end_lr!r}")
    return float(end_lr)


def _poly(base: Any, end_lr: float, power: float, t: int, span: int) -> Any:
    return (base - end_lr) * (1 - min(t, span) / span) ** power + end_lr


class StepLR(_ClosedForm):
    """Each group's rate times ``gamma`` every ``step_size`` steps.

    Args:
        optimizer: the optimizer whose rates it sets.
        total_steps: the run's length (Colossal-AI's signature; not used by the formula).
        step_size: steps between decays.
        gamma: the factor.
        last_epoch: the last step taken (-1: start).

    Example:
        >>> StepLR(optimizer, total_steps=90, step_size=30, gamma=0.1)
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_steps: int, step_size: int = 1, gamma: float = 0.1,
        last_epoch: int = -1,
    ) -> None:  # fmt: skip
        _check_steps(self, total_steps)
        self.step_size, self.gamma = _steps("StepLR", "step_size", step_size, 1), gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base: Any, t: int) -> Any:
        """``base * gamma ** (t // step_size)``."""
        return base * self.gamma ** (t // self.step_size)


class ExponentialLR(_ClosedForm):
    """Each group's rate times ``gamma`` every step.

    Args:
        optimizer: the optimizer whose rates it sets.
        total_steps: the run's length (Colossal-AI's signature; not used by the formula).
        gamma: the factor (Colossal-AI's default 1.0 keeps the rate).
        last_epoch: the last step taken (-1: start).

    Example:
        >>> ExponentialLR(optimizer, total_steps=100, gamma=0.95)
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_steps: int, gamma: float = 1.0, last_epoch: int = -1
    ) -> None:
        _check_steps(self, total_steps)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base: Any, t: int) -> Any:
        """``base * gamma ** t``."""
        return base * self.gamma**t


class OneCycleLR(_TorchOneCycleLR):
    """torch's 1cycle policy with each group's current rate as its ``max_lr``.

    Args:
        optimizer: the optimizer whose rates (and momenta, with ``cycle_momentum``) it sets.
        total_steps: steps in the cycle.
        pct_start: the fraction of steps spent raising the rate.
        anneal_strategy: ``"cos"`` or ``"linear"``.
        cycle_momentum: cycle the momentum inversely to the rate.
        base_momentum: the lowest momentum.
        max_momentum: the highest momentum.
        div_factor: the first rate is ``max_lr / div_factor``.
        final_div_factor: the last rate is the first one divided by this.
        last_epoch: the last step taken (-1: start).
        three_phase: torch's third phase (the docs of Colossal-AI list it; its code dropped it).

    Example:
        >>> OneCycleLR(optimizer, total_steps=len(train_dl) * NUM_EPOCHS)   # stepped per batch
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_steps: int, pct_start: float = 0.3, anneal_strategy: str = "cos",
        cycle_momentum: bool = True, base_momentum: float = 0.85, max_momentum: float = 0.95,
        div_factor: float = 25.0, final_div_factor: float = 10000.0, last_epoch: int = -1,
        three_phase: bool = False, **kwargs: Any,
    ) -> None:  # fmt: skip
        _check_steps(self, total_steps, extra=kwargs, hint="give the cycle's length as total_steps")
        max_lrs = [group.get("max_lr", group["lr"]) for group in optimizer.param_groups]  # max_lr: resumed
        super().__init__(
            optimizer, max_lrs, total_steps=total_steps, pct_start=pct_start, anneal_strategy=anneal_strategy,  # type: ignore[arg-type]
            cycle_momentum=cycle_momentum, base_momentum=base_momentum, max_momentum=max_momentum,
            div_factor=div_factor, final_div_factor=final_div_factor, three_phase=three_phase, last_epoch=last_epoch,
        )  # fmt: skip


class _StepFunction(LRScheduler):
    """What ``LambdaLR`` and ``MultiplicativeLR`` add to torch's: ``total_steps`` (checked, not
    used) and a clear error without ``lr_lambda``; put before the torch class in the bases."""

    total_steps: int

    def __init__(
        self, optimizer: torch.optim.Optimizer, total_steps: int,
        lr_lambda: Callable[[int], float] | list[Callable[[int], float]] | None = None, last_epoch: int = -1,
    ) -> None:  # fmt: skip
        _check_steps(self, total_steps)
        if lr_lambda is None:
            raise EngineError(
                f"{type(self).__name__} needs lr_lambda=f (a function of the step, or one per param group)"
            )
        torch_init: Any = super().__init__  # the torch class after this one: (optimizer, lr_lambda, last_epoch)
        torch_init(optimizer, lr_lambda, last_epoch=last_epoch)


class LambdaLR(_StepFunction, _TorchLambdaLR):
    """torch's ``LambdaLR``: each group's initial rate times ``lr_lambda(step)``.

    Args:
        optimizer: the optimizer whose rates it sets.
        total_steps: the run's length (Colossal-AI's signature; not used).
        lr_lambda: a function of the step, or a list of them (one per param group).
        last_epoch: the last step taken (-1: start).

    Example:
        >>> LambdaLR(optimizer, total_steps=100, lr_lambda=lambda step: 0.95**step)
    """


class MultiplicativeLR(_StepFunction, _TorchMultiplicativeLR):
    """torch's ``MultiplicativeLR``: at each step the rate is multiplied by ``lr_lambda(step)``.

    Args: as :class:`LambdaLR`.

    Example:
        >>> MultiplicativeLR(optimizer, total_steps=100, lr_lambda=lambda step: 0.95)
    """
