"""Parallelism from the config, on torch.distributed: DDP, ZeRO-1, FSDP2 and tensor parallel.

:func:`check_parallel` validates the ``parallel``/``zero`` settings before any collective;
:func:`parallelize` builds the model, optimizer and the Engine's :class:`ParallelPolicy`.
:mod:`ember.parallel.plans` has ready tensor-parallel plans. See ``docs/parallel.md``.

Names load on first use, so the launch (which needs only :mod:`ember.context`) stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ember.parallel import plans
    from ember.parallel.ddp import wrap_data_parallel
    from ember.parallel.policy import DataParallelPolicy, ParallelPolicy, ShardedPolicy, ZeroPolicy
    from ember.parallel.strategy import Parallelized, ParallelPlan, check_parallel, parallelize

_ATTRS = {
    "wrap_data_parallel": "ember.parallel.ddp",
    "ParallelPolicy": "ember.parallel.policy",
    "DataParallelPolicy": "ember.parallel.policy",
    "ZeroPolicy": "ember.parallel.policy",
    "ShardedPolicy": "ember.parallel.policy",
    "Parallelized": "ember.parallel.strategy",
    "ParallelPlan": "ember.parallel.strategy",
    "check_parallel": "ember.parallel.strategy",
    "parallelize": "ember.parallel.strategy",
}

__all__ = [
    "DataParallelPolicy",
    "ParallelPlan",
    "ParallelPolicy",
    "Parallelized",
    "ShardedPolicy",
    "ZeroPolicy",
    "check_parallel",
    "parallelize",
    "plans",
    "wrap_data_parallel",
]


def __getattr__(name: str) -> Any:
    if name == "plans":
        return importlib.import_module("ember.parallel.plans")
    if name in _ATTRS:
        return getattr(importlib.import_module(_ATTRS[name]), name)
    raise AttributeError(f"module 'ember.parallel' has no attribute {name!r}")
