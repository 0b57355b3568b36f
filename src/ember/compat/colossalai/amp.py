"""Colossal-AI's ``colossalai.amp``: the ``AMP_TYPE`` a config's ``fp16=dict(mode=...)`` names.

ember's config reads ``fp16=dict(mode=AMP_TYPE.TORCH, **grad_scaler_options)`` as
``amp="fp16"`` with those ``grad_scaler`` options (torch autocast and ``GradScaler``).
``AMP_TYPE.APEX`` and ``AMP_TYPE.NAIVE`` are refused by the config with a ``ConfigError`` that
names ``mode='torch'`` (ember does not ship apex, nor a home-made fp16 optimizer; use
``AMP_TYPE.TORCH`` or ``amp="bf16"``).
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
    """

    APEX = "apex"
    TORCH = "torch"
    NAIVE = "naive"
