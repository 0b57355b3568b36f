"""Rebuild the user's optimizer for sharded parameters, and re-point schedulers at the new one.

ZeRO and FSDP2 need an optimizer that is not the one the user built: ZeRO-1 wraps the user's
optimizer *class* in :class:`~torch.distributed.optim.ZeroRedundancyOptimizer`, and FSDP2 /
tensor parallelism replace the model's parameters with DTensors, so the optimizer must hold the
new ones. Either way ember builds a new optimizer from the user's class, constructor defaults
and param groups (with every per-group setting, e.g. a group's own ``lr``), and moves the
learning-rate scheduler given to :func:`ember.initialize` over to it; the user's optimizer
becomes a view of the new one (:func:`make_view`), so schedulers built over it before
``initialize`` keep driving the learning rate that steps.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ember.errors import EngineError

_NEEDS_FULL_VIEW = {
    "LBFGS": "its step() needs a closure and it flattens every parameter into one vector",
    "SparseAdam": "it needs sparse gradients, which sharded parameters do not produce",
}


def check_rebuildable(optimizer: torch.optim.Optimizer, why: str) -> None:
    """Raise EngineError unless ember can rebuild ``optimizer`` over new (sharded) parameters.

    Args:
        optimizer: the user's optimizer.
        why: the setting that needs the rebuild, for the message (e.g. ``"zero stage 3"``).
    """
    cls = type(optimizer)
    name = f"{cls.__module__}.{cls.__qualname__}"
    fix = (
        f"use an element-wise optimizer such as torch.optim.SGD, Adam or AdamW, or remove {why} "
        "(the optimizer is rebuilt over the sharded parameters from its class, defaults and param groups)"
    )
    if cls.__name__ == "ZeroRedundancyOptimizer":
        raise EngineError(
            f"the optimizer is already a ZeroRedundancyOptimizer: pass the plain optimizer (e.g. "
            f"torch.optim.AdamW(model.parameters(), ...)) and let {why} build the sharded one"
        )
    if cls.__name__ in _NEEDS_FULL_VIEW:
        raise EngineError(f"{why} cannot shard the optimizer {name}: {_NEEDS_FULL_VIEW[cls.__name__]}; {fix}")
    closure = inspect.signature(cls.step).parameters.get("closure")
    if closure is not None and closure.default is inspect.Parameter.empty:
        raise EngineError(f"{why} cannot shard the optimizer {name}: its step() requires a closure; {fix}")
    if optimizer.state:
        raise EngineError(
            f"the optimizer {name} already has state (it has stepped), which {why} cannot carry over to "
            "the sharded parameters: call ember.initialize before the first step, and restore saved state "
            "with engine.load_state_dict(...)"
        )


def constructor_defaults(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's ``defaults`` that its constructor accepts (AdamW's own
    ``decoupled_weight_decay`` default, for one, is not a constructor argument)."""
    params = inspect.signature(type(optimizer).__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(optimizer.defaults)
    return {k: v for k, v in optimizer.defaults.items() if k in params}


def param_groups_for(
    optimizer: torch.optim.Optimizer, replace: Callable[[torch.Tensor], torch.Tensor]
) -> list[dict[str, Any]]:
    """Copies of the optimizer's param groups (all settings kept) with each parameter replaced."""
    groups = []
    for group in optimizer.param_groups:
        new = {k: v for k, v in group.items() if k not in ("params", "param_names")}
        params = [replace(p) for p in group["params"]]
        names = group.get("param_names")
        new["params"] = list(zip(names, params, strict=True)) if names is not None else params
        groups.append(new)
    return groups


def parameter_names(model: nn.Module) -> dict[int, str]:
    """``id(parameter) -> name`` for the model's parameters (the first name of a shared one)."""
    return {id(p): name for name, p in model.named_parameters()}


def rebuild_optimizer(
    optimizer: torch.optim.Optimizer, model: nn.Module, names: Mapping[int, str], why: str
) -> torch.optim.Optimizer:
    """A new optimizer of the user's class over ``model``'s current (sharded) parameters.

    Args:
        optimizer: the user's optimizer, built over the parameters ``names`` was taken from.
        model: the model after sharding (its parameters are now DTensors).
        names: :func:`parameter_names` of the model before sharding.
        why: the setting that needs the rebuild, for error messages.

    Returns:
        ``type(optimizer)(groups, **defaults)``; parameters that are not the model's (e.g. a
        criterion's) stay as they were.
    """
    current = dict(model.named_parameters())

    def replace(p: torch.Tensor) -> torch.Tensor:
        name = names.get(id(p))
        return current[name] if name is not None and name in current else p

    groups = param_groups_for(optimizer, replace)
    try:
        return type(optimizer)(groups, **constructor_defaults(optimizer))
    except (TypeError, ValueError, RuntimeError) as exc:
        cls = type(optimizer)
        raise EngineError(
            f"{why} could not rebuild the optimizer {cls.__module__}.{cls.__qualname__} over the sharded "
            f"parameters ({type(exc).__name__}: {exc}): its constructor must accept (param_groups, **defaults) "
            "like torch.optim optimizers do"
        ) from None


def retarget_scheduler(scheduler: Any, old: torch.optim.Optimizer, new: torch.optim.Optimizer) -> None:
    """Make ``scheduler`` (and the schedulers it chains) drive ``new`` instead of ``old``."""
    if scheduler is None:
        return
    if getattr(scheduler, "optimizer", None) is old:
        scheduler.optimizer = new
        _mark_step_tracked(new)
    for child in getattr(scheduler, "_schedulers", ()):
        retarget_scheduler(child, old, new)


def make_view(optimizer: torch.optim.Optimizer, stepping: torch.optim.Optimizer) -> None:
    """Make the user's ``optimizer`` a view of ``stepping``, the optimizer ember built from it.

    Anything built over the user's optimizer before :func:`ember.initialize` (a learning-rate
    scheduler above all) keeps working: ``optimizer.param_groups`` and ``optimizer.state`` become
    ``stepping``'s own objects, so a scheduler that sets ``group["lr"]`` sets the learning rate
    the sharded optimizer steps with (ZeroRedundancyOptimizer copies its groups' settings to its
    local shard before each step). ``optimizer.step``, ``state_dict`` and ``load_state_dict``
    call ``stepping``'s, and every step of ``stepping`` counts as a step of ``optimizer`` for
    torch's "scheduler stepped before the optimizer" check.

    Args:
        optimizer: the user's optimizer, not stepped yet.
        stepping: the optimizer that steps (same number of param groups).

    Example:
        >>> sched = CosineAnnealingLR(opt, T_max=10)          # built before initialize
        >>> engine, *_ = ember.initialize(model, opt, loss)   # zero=dict(stage=1): a new optimizer
        >>> sched.step()                                       # sets engine.optimizer's lr
    """
    if optimizer is stepping:
        return
    if len(optimizer.param_groups) != len(stepping.param_groups):  # unreachable: rebuilds keep every group
        raise RuntimeError("the rebuilt optimizer lost or gained param groups")
    optimizer.param_groups = stepping.param_groups
    optimizer.state = stepping.state
    views = stepping.__dict__.setdefault("_ember_views", weakref.WeakSet())
    views.add(optimizer)
    _mark_step_tracked(stepping)

    def step(*args: Any, **kwargs: Any) -> Any:
        return stepping.step(*args, **kwargs)

    step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = step  # type: ignore[method-assign]
    optimizer.state_dict = stepping.state_dict  # type: ignore[method-assign]
    optimizer.load_state_dict = stepping.load_state_dict  # type: ignore[method-assign]


def shares_param_groups(optimizer: Any, other: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` is ``other`` or a view of it (:func:`make_view`): setting a group's
    ``lr`` on one sets it on the other."""
    return optimizer is other or getattr(optimizer, "param_groups", None) is other.param_groups


def _mark_step_tracked(optimizer: torch.optim.Optimizer) -> None:
    """Wrap ``optimizer.step`` the way torch's LRScheduler does when it is built, so that the
    scheduler's "step() called before optimizer.step()" check keeps working (for the
    optimizer and for its views)."""
    if hasattr(optimizer.step, "_wrapped_by_lr_sched"):
        return
    func = optimizer.step.__func__  # type: ignore[attr-defined]
    ref = weakref.ref(optimizer)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        opt = ref()
        opt._opt_called = True  # type: ignore[union-attr]
        for view in opt.__dict__.get("_ember_views", ()):
            view._opt_called = True
        return func.__get__(opt, opt.__class__)(*args, **kwargs)

    wrapper._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = wrapper  # type: ignore[method-assign]
