"""Precision policies: how a step autocasts, scales the loss and applies the update.

``amp=None`` is :class:`Precision`, ``"bf16"`` :class:`AutocastPrecision`, ``"fp16"``
:class:`ScaledPrecision` (autocast + torch's GradScaler), and either with
``master_weights=True`` :class:`MasterWeights` (low-precision parameters, fp32 masters in the
optimizer). :func:`make_precision` picks one from the config; the Engine has one step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ember.amp.master import LossScale, MasterShard, MasterWeights, source_parameter
from ember.amp.policies import AutocastPrecision, Precision, ScaledPrecision
from ember.errors import ConfigError

__all__ = [
    "AutocastPrecision",
    "LossScale",
    "MasterShard",
    "MasterWeights",
    "Precision",
    "ScaledPrecision",
    "make_precision",
    "source_parameter",
]


MASTER_SCALE_OPTIONS = ("hysteresis", "min_scale", "max_scale")
"""``grad_scaler`` options of the master-weights loss scale that torch's GradScaler does not have."""


def make_precision(
    amp: str | None,
    device: torch.device,
    scaler_options: Mapping[str, Any] | None = None,
    master_weights: bool = False,
) -> Precision:
    """The policy for the config's ``amp`` value (None, ``"bf16"`` or ``"fp16"``) and ``master_weights``.

    Args:
        amp: the autocast dtype's name, or None.
        device: this process's device.
        scaler_options: the config's ``grad_scaler`` (``init_scale``, ``growth_factor``,
            ``backoff_factor``, ``growth_interval``, ``enabled``; with master weights also
            ``hysteresis``, ``min_scale``, ``max_scale``).
        master_weights: keep the parameters in ``amp``'s dtype and fp32 masters in the optimizer.

    Raises:
        ConfigError: an unknown ``amp``; ``master_weights`` without ``amp``; loss-scale options
            that need master weights.

    Example:
        >>> make_precision("fp16", torch.device("cpu"), {"init_scale": 1024.0}, master_weights=True).loss_scale
        1024.0
    """
    options = dict(scaler_options or {})
    if amp not in (None, "bf16", "fp16"):
        raise ConfigError(f"config key 'amp' must be None, 'bf16' or 'fp16', got {amp!r}")
    if master_weights:
        if amp is None:
            raise ConfigError(
                "config master_weights=True needs amp='fp16' or amp='bf16': the dtype the parameters are kept in"
            )
        if options.pop("enabled", True) is False:
            raise ConfigError("config grad_scaler.enabled=False: fp16 master weights always scale the loss")
        scale = LossScale(**options) if amp == "fp16" else None
        return MasterWeights(device, torch.float16 if amp == "fp16" else torch.bfloat16, scale)
    extra = [k for k in MASTER_SCALE_OPTIONS if k in options]
    if extra:
        raise ConfigError(
            f"config grad_scaler.{extra[0]} applies to master_weights=True only (torch's GradScaler, which "
            "amp='fp16' uses, has no such option): remove it, or set master_weights=True"
        )
    if amp is None:
        return Precision(device)
    if amp == "bf16":
        return AutocastPrecision(device, torch.bfloat16)
    return ScaledPrecision(device, options)
