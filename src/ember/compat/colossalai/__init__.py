"""Colossal-AI's names on ember: ``import ember.compat.colossalai as colossalai``.

A Colossal-AI program runs after rewriting its imports (``colossalai`` ->
``ember.compat.colossalai``, with the same sub-module paths): ``.amp``, ``.context``,
``.core`` (``global_context as gpc``), ``.logging``, ``.utils``, ``.nn.lr_scheduler``,
``.nn.metric``, ``.trainer`` and ``.trainer.hooks``. Each name is ember's own object or a thin
adapter of it; ``docs/migrating.md`` lists them and what still differs.

Example:
    >>> import ember.compat.colossalai as colossalai
    >>> colossalai.launch_from_torch(config="./config.py")
    >>> engine, train_dl, test_dl, _ = colossalai.initialize(model, optimizer, criterion, train_dl, test_dl)
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ._launch import (
    get_default_parser,
    initialize,
    launch,
    launch_from_openmpi,
    launch_from_slurm,
    launch_from_torch,
)

__all__ = [
    "get_default_parser",
    "initialize",
    "launch",
    "launch_from_openmpi",
    "launch_from_slurm",
    "launch_from_torch",
]

_SUBMODULES = frozenset({"amp", "context", "core", "engine", "global_variables", "logging", "nn", "pipeline",
                         "trainer", "utils"})  # fmt: skip
"""What ``import colossalai`` makes reachable as attributes (its ``__init__`` imports them all)."""


def __getattr__(name: str) -> ModuleType:
    """``colossalai.logging``, ``colossalai.nn``...: imported at the first use, as after Colossal-AI's import."""
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
