"""The layers of one tensor mode, bound to its grid: write a model once, build it for any mode.

``layers_for(grid)`` returns a :class:`LayerSet` whose ``Linear``, ``LayerNorm``,
``Embedding``, ``VocabParallelEmbedding``, ``PatchEmbedding``, ``Classifier``,
``VocabParallelClassifier``, ``Dropout``, ``CrossEntropyLoss`` and
``VocabParallelCrossEntropyLoss`` build that mode's classes on that grid — or, for
``grid=None``, the one-process ones (torch's modules, :mod:`ember.parallel.vanilla`). This is
what Colossal-AI's ``colossalai.nn.Linear`` & co. do from the launched config; the explicit
grid lets one process build the same model for several layouts (and the one-process
reference it is tested against).

Example:
    >>> def mlp(L, dim):
    ...     return nn.Sequential(L.LayerNorm(dim), L.Linear(dim, 4 * dim), nn.GELU(), L.Linear(4 * dim, dim))
    >>> one = mlp(layers_for(None), 16)
    >>> cube = mlp(layers_for(grid_of(layout_3d)), 16)
    >>> cube.load_state_dict(one.state_dict())   # the same weights, split over the cube
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from torch import nn

from ember.parallel import tensor1d, tensor2d, tensor2p5d, tensor3d
from ember.parallel.grid import TensorGrid
from ember.parallel.vanilla import Accuracy, VanillaClassifier, VanillaPatchEmbedding

__all__ = ["LAYER_NAMES", "LayerSet", "layers_for"]

LAYER_NAMES = (
    "Linear", "LayerNorm", "Embedding", "VocabParallelEmbedding", "PatchEmbedding", "Classifier",
    "VocabParallelClassifier", "Dropout", "CrossEntropyLoss", "VocabParallelCrossEntropyLoss", "Accuracy",
)  # fmt: skip
"""The layers every :class:`LayerSet` has (``Accuracy`` counts a batch's correct predictions
for ``AccuracyHook(accuracy_func=...)`` from the mode's classifier logits)."""

MODE_CLASSES: dict[str | None, dict[str, Any]] = {
    None: {
        "Linear": nn.Linear, "LayerNorm": nn.LayerNorm, "Embedding": nn.Embedding,
        "VocabParallelEmbedding": nn.Embedding, "PatchEmbedding": VanillaPatchEmbedding,
        "Classifier": VanillaClassifier, "VocabParallelClassifier": VanillaClassifier, "Dropout": nn.Dropout,
        "CrossEntropyLoss": nn.CrossEntropyLoss, "VocabParallelCrossEntropyLoss": nn.CrossEntropyLoss,
        "Accuracy": Accuracy,
    },
    **{
        mode: {name: getattr(module, f"{name}{suffix}", None) for name in LAYER_NAMES}
        for mode, module, suffix in (
            ("1d", tensor1d, "1D"), ("2d", tensor2d, "2D"), ("2.5d", tensor2p5d, "2p5D"), ("3d", tensor3d, "3D")
        )
    },
}  # fmt: skip
"""Each mode's class for each layer name (``Dropout`` of the 2-D/2.5-D/3-D modes and 1-D's
``CrossEntropyLoss`` are torch's)."""
for _mode in ("2d", "2.5d", "3d"):
    MODE_CLASSES[_mode]["Dropout"] = nn.Dropout
MODE_CLASSES["1d"]["CrossEntropyLoss"] = nn.CrossEntropyLoss
MODE_CLASSES["1d"]["Accuracy"] = Accuracy  # 1-D classifiers give whole logits on every rank


class LayerSet:
    """The layer classes of one tensor mode, bound to a grid (or the one-process ones).

    Attributes:
        mode: ``"1d"``, ``"2d"``, ``"2.5d"``, ``"3d"``, or None for one process.
        grid: the grid the layers are built on, or None.

    Each name of :data:`LAYER_NAMES` is an attribute that builds that layer, e.g.
    ``L.Linear(16, 64)``; the grid layers get ``grid=`` filled in.
    """

    def __init__(self, grid: TensorGrid | None) -> None:
        self.grid = grid
        self.mode = grid.mode if grid is not None else None
        for name, cls in MODE_CLASSES[self.mode].items():
            takes_grid = "grid" in inspect.signature(cls).parameters
            bound = functools.partial(cls, grid=grid) if grid is not None and takes_grid else cls
            setattr(self, name, bound)

    def __getattr__(self, name: str) -> Any:  # for the type checker: the layers are set in __init__
        raise AttributeError(f"LayerSet has no layer {name!r}; it has {', '.join(LAYER_NAMES)}")

    def __repr__(self) -> str:
        return f"LayerSet({self.grid if self.grid is not None else 'one process'})"


def layers_for(grid: TensorGrid | None) -> LayerSet:
    """The layers of ``grid``'s mode on ``grid``; ``None``: the one-process layers.

    Example:
        >>> L = layers_for(grid_of(ember.context.layout))
        >>> head = L.Classifier(16, 10)
    """
    return LayerSet(grid)
