"""Small helpers the built-in hooks share."""

from __future__ import annotations

import difflib
import math
from typing import TYPE_CHECKING, Any

import torch

from ember.errors import HookError

if TYPE_CHECKING:
    from ember.trainer.trainer import Trainer

PHASES = ("train", "test")


def check_phases(on: Any, hook: str) -> tuple[str, ...]:
    """Validate ``on=("train", "test")``-style arguments."""
    phases = (on,) if isinstance(on, str) else tuple(on)
    bad = [p for p in phases if p not in PHASES]
    if bad or not phases:
        raise HookError(f"{hook}(on=...) takes 'train' and/or 'test', got {on!r}")
    return phases


def current_lr(trainer: Trainer) -> float | None:
    """The learning rate of the optimizer's first parameter group (the one the last step used)."""
    groups = trainer.engine.optimizer.param_groups
    if not groups:
        return None
    lr = groups[0].get("lr")
    return float(lr.item() if isinstance(lr, torch.Tensor) else lr) if lr is not None else None


def fmt(value: float) -> str:
    """A compact number for log lines."""
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:.4g}"


def accumulator(device: torch.device) -> torch.Tensor:
    """A ``[sum, count]`` tensor on ``device`` (float64 where the device has it)."""
    dtype = torch.float32 if device.type == "mps" else torch.float64
    return torch.zeros(2, dtype=dtype, device=device)


def epoch_value(trainer: Trainer, monitor: str, who: str) -> float | None:
    """``monitor``'s value recorded this epoch; None when its phase did not run this epoch.

    Raises:
        HookError: the phase ran (other ``"<phase>/..."`` metrics exist) but ``monitor`` was
            not recorded: a misspelt name or a missing metric hook.
    """
    value = trainer.history.get(monitor, trainer.cur_epoch)
    if value is not None:
        return value
    phase = monitor.split("/")[0]
    recorded = sorted(trainer.history.at(trainer.cur_epoch))
    if any(n.split("/")[0] == phase for n in recorded):
        close = difflib.get_close_matches(monitor, recorded, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise HookError(
            f"{who} monitors {monitor!r}, which no hook recorded this epoch: {hint}recorded: {recorded} "
            "(add the metric's hook, or fix the name)"
        )
    return None
