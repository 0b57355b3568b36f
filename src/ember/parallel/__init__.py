"""Parallelism from the config, on torch.distributed: DDP, ZeRO-1, FSDP2 and tensor parallel.

:func:`check_parallel` validates the ``parallel``/``zero`` settings before any collective;
:func:`parallelize` builds the model, optimizer and the Engine's :class:`ParallelPolicy`.
:mod:`ember.parallel.plans` has ready tensor-parallel plans. See ``docs/parallel.md``.

The multi-dimensional tensor modes (``parallel.tensor.mode`` ``"2d"``, ``"2.5d"``, ``"3d"``,
and Colossal-AI's 1-D layers) are layers: :mod:`ember.parallel.tensor1d`,
:mod:`~ember.parallel.tensor2d`, :mod:`~ember.parallel.tensor2p5d`,
:mod:`~ember.parallel.tensor3d`, on a :class:`TensorGrid` (:func:`grid_of`);
:func:`layers_for` gives a mode's set, to write a model once for every mode.

Names load on first use, so the launch (which needs only :mod:`ember.context`) stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember._lazy import lazy_getattr

if TYPE_CHECKING:
    from ember.parallel import plans, tensor1d, tensor2d, tensor2p5d, tensor3d
    from ember.parallel.ddp import wrap_data_parallel
    from ember.parallel.grid import TensorGrid, grid_of
    from ember.parallel.grid_policy import GridPolicy
    from ember.parallel.layers import LayerSet, layers_for
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
    # issue 27: the 2-D / 2.5-D / 3-D (and Colossal-AI 1-D) tensor-parallel layers
    "TensorGrid": "ember.parallel.grid",
    "grid_of": "ember.parallel.grid",
    "GridPolicy": "ember.parallel.grid_policy",
    "LayerSet": "ember.parallel.layers",
    "layers_for": "ember.parallel.layers",
}
_MODULES = ("plans", "tensor1d", "tensor2d", "tensor2p5d", "tensor3d")

__all__ = [
    "DataParallelPolicy",
    "GridPolicy",
    "LayerSet",
    "ParallelPlan",
    "ParallelPolicy",
    "Parallelized",
    "ShardedPolicy",
    "TensorGrid",
    "ZeroPolicy",
    "check_parallel",
    "grid_of",
    "layers_for",
    "parallelize",
    "plans",
    "tensor1d",
    "tensor2d",
    "tensor2p5d",
    "tensor3d",
    "wrap_data_parallel",
]


__getattr__ = lazy_getattr(__name__, _ATTRS, _MODULES)
