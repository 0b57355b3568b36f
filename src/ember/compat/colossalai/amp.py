"""Colossal-AI's ``colossalai.amp``: the ``AMP_TYPE`` a config's ``fp16=dict(mode=...)`` names.

ember's config reads ``fp16=dict(mode=AMP_TYPE.TORCH, **grad_scaler_options)`` as
``amp="fp16"`` with those ``grad_scaler`` options (torch autocast and ``GradScaler``), and
``fp16=dict(mode=AMP_TYPE.NAIVE, initial_scale=..., growth_factor=..., backoff_factor=...,
growth_interval=..., hysteresis=..., min_scale=..., max_scale=..., clip_grad_norm=...,
verbose=...)`` as ``amp="fp16", master_weights=True`` (fp16 parameters, fp32 master copies in
the optimizer, :class:`ember.amp.LossScale`) with those loss-scale options and
``clip_grad_norm``. ``AMP_TYPE.APEX`` is refused with a ``ConfigError`` naming both working modes
(apex is not a dependency); so are ``fp16 = True`` (Colossal-AI's ``fp16`` is a dict) and the
NAIVE options ember has no counterpart for (``log_num_zeros_in_grad=True``,
``dynamic_grad_scale=False``).
"""

from __future__ import annotations

import enum

__all__ = ["AMP_TYPE"]


class AMP_TYPE(enum.Enum):
    """The mixed-precision backends a Colossal-AI config names.

    Example:
        >>> # config.py
        >>> from ember.compat.colossalai.amp import AMP_TYPE
        >>> fp16 = dict(mode=AMP_TYPE.TORCH)   # ember: amp="fp16"
        >>> fp16 = dict(mode=AMP_TYPE.NAIVE)   # ember: amp="fp16", master_weights=True
    """

    APEX = "apex"
    TORCH = "torch"
    NAIVE = "naive"
