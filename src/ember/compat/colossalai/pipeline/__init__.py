"""Colossal-AI's ``colossalai.pipeline``: ``PipelinableContext`` and ``PipelinableModel``.

A Colossal-AI program splits its model for pipeline parallelism like this::

    pipelinable = PipelinableContext()
    with pipelinable:
        model = build_vit()                       # any nn.Module, built inside the context
    pipelinable.to_layer_list()                   # or to_layer_list(exec_seq) with names, SPLIT_NODE
    pipelinable.policy = "uniform"                # "balanced" (by parameters), "customized", a dict
    model = pipelinable.partition(1, gpc.pipeline_parallel_size, gpc.get_local_rank(ParallelMode.PIPELINE))
    engine, train_dl, test_dl, _ = colossalai.initialize(model, optimizer, criterion, train_dl, test_dl)

and sets ``NUM_MICRO_BATCHES`` in its config. On ember ``partition`` returns the **whole**
sequence of layers as one :class:`PipelinableModel` (its layers ``_module_list.0``, ``_module_list.1``,
... in execution order) that knows where the stages start; ``colossalai.initialize`` hands
those split points (and ``NUM_MICRO_BATCHES`` as ``parallel.pipeline.microbatches``) to
:func:`ember.initialize`, which keeps this rank's stage and builds the pipeline schedule that a
``Trainer(engine, logger)`` runs. Every rank builds the whole model once (Colossal-AI builds
only its stage's layers); the context keeps the random number generator's state as it found it,
as Colossal-AI's does.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_module_registration_hook

from ember.errors import ConfigError
from ember.parallel.pipeline import sequential_layers

__all__ = ["PipelinableContext", "PipelinableModel"]

SPLIT_NODE = "SPLIT_NODE"
"""The ``exec_seq`` entry that ends a stage under the ``"customized"`` policy."""


class PipelinableModel(nn.Module):
    """The model's layers in execution order, and where its pipeline stages start.

    Its forward applies ``_module_list`` in order (a tuple output is unpacked into the next
    layer's arguments), which is how :func:`ember.initialize` reads a model it splits.

    Attributes:
        pipeline_split_points: the names of the layers that start stages 1, 2, ...
    """

    def __init__(self, layers: Sequence[nn.Module], split_points: Sequence[str]) -> None:
        super().__init__()
        self._module_list = nn.ModuleList(layers)
        self.pipeline_split_points = tuple(split_points)

    def forward(self, *args: Any) -> Any:
        """Run the layers in order."""
        out: Any = args
        for layer in self._module_list:
            out = layer(*out) if isinstance(out, tuple) else layer(out)
        return out


class _Function(nn.Module):
    """A function of ``exec_seq`` (``lambda x: torch.flatten(x, 1)``) as a layer."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


class PipelinableContext:
    """Records the model built inside it, and splits it into pipeline stages.

    Args:
        policy: ``"balanced"`` (stages of about equal parameter counts), ``"uniform"`` (of equal
            layer counts, the last stages taking one more), ``"customized"`` (at the
            ``"SPLIT_NODE"`` entries of ``to_layer_list(exec_seq)``), or a dict ``{stage: [(start,
            end)]}`` of layer ranges.

    Example:
        >>> with (ctx := PipelinableContext()):
        ...     model = ViT()
        >>> ctx.to_layer_list(); ctx.policy = "uniform"
        >>> model = ctx.partition(1, 2, gpc.get_local_rank(ParallelMode.PIPELINE))
    """

    def __init__(self, policy: str | dict[int, list[tuple[int, int]]] = "balanced") -> None:
        self._policy = policy
        self._parents: dict[int, nn.Module] = {}
        self._children: set[int] = set()
        self._handle: Any = None
        self._rng: torch.Tensor | None = None
        self._layers: list[nn.Module] = []
        self._split_after: list[int] = []  # customized: layer counts at each SPLIT_NODE
        self._functions = 0

    @property
    def policy(self) -> str | dict[int, list[tuple[int, int]]]:
        """How :meth:`partition` splits the layers."""
        return self._policy

    @policy.setter
    def policy(self, policy: str | dict[int, list[tuple[int, int]]]) -> None:
        self._policy = policy

    @property
    def layers_count(self) -> int:
        """The layers :meth:`to_layer_list` found."""
        return len(self._layers)

    @property
    def funcs_count(self) -> int:
        """The functions of ``exec_seq`` made into layers."""
        return self._functions

    def __enter__(self) -> PipelinableContext:
        self._rng = torch.get_rng_state()
        self._handle = register_module_module_registration_hook(self._registered)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.remove()
        if self._rng is not None:
            torch.set_rng_state(self._rng)

    def _registered(self, module: nn.Module, name: str, submodule: nn.Module | None) -> None:
        self._parents.setdefault(id(module), module)
        if submodule is not None:
            self._children.add(id(submodule))

    @property
    def model(self) -> nn.Module:
        """The outermost module built inside the context.

        Raises:
            ConfigError: none was built, or several unrelated models were.
        """
        roots = [m for i, m in self._parents.items() if i not in self._children]
        with_params = [m for m in roots if any(True for _ in m.parameters())]
        if len(with_params) != 1:
            found = ", ".join(type(m).__name__ for m in with_params) or "none"
            raise ConfigError(
                f"PipelinableContext needs exactly one model built inside `with pipelinable:` (found: {found}); "
                "build the model, and only it, inside the context"
            )
        return with_params[0]

    def to_layer_list(self, exec_seq: Sequence[Any] | None = None) -> None:
        """List the layers in execution order.

        Args:
            exec_seq: None for the model's top-level children (``nn.ModuleList``/``Sequential``
                expanded); else module names in order, ``"SPLIT_NODE"`` marks and functions
                (or ``(function, "front")`` / ``(function, "behind")``) run between them.

        Raises:
            ConfigError: a name that is not a module of the model.
        """
        model = self.model
        if exec_seq is None:
            self._layers = [layer for _, layer in sequential_layers(model)]
            return
        modules = dict(model.named_modules())
        self._layers, self._split_after, self._functions = [], [], 0
        for element in exec_seq:
            if isinstance(element, str) and element == SPLIT_NODE:
                self._split_after.append(len(self._layers))
            elif isinstance(element, str):
                if element not in modules:
                    raise ConfigError(
                        f"to_layer_list: {element!r} is not a module of {type(model).__name__}; its modules: "
                        f"{', '.join(n for n in modules if n)}"
                    )
                self._layers.append(modules[element])
            else:
                fn = element[0] if isinstance(element, tuple) else element
                if not callable(fn):
                    raise ConfigError(f"to_layer_list: {element!r} is neither a module name nor a function")
                self._layers.append(_Function(fn))
                self._functions += 1

    def partition(self, num_chunks: int, pipeline_size: int, rank: int) -> PipelinableModel:
        """The model as a :class:`PipelinableModel` whose stages follow :attr:`policy`.

        Args:
            num_chunks: must be 1 (no interleaved stages).
            pipeline_size: the number of stages (``gpc.pipeline_parallel_size``).
            rank: this rank's stage, checked (every rank gets the whole model: ember keeps the stage).

        Raises:
            ConfigError: ``num_chunks`` other than 1, a rank out of range, fewer layers than
                stages, or a policy that does not give each stage one contiguous range.
        """
        if num_chunks != 1:
            raise ConfigError(f"partition(num_chunks={num_chunks}): ember runs one chunk per stage; use 1")
        if not 0 <= rank < pipeline_size:
            raise ConfigError(f"partition(rank={rank}) is not a stage of {pipeline_size}")
        if not self._layers:
            self.to_layer_list()
        n = len(self._layers)
        if n < pipeline_size:
            raise ConfigError(f"the model has {n} layers, fewer than the {pipeline_size} pipeline stages")
        starts = self._starts(n, pipeline_size)
        return PipelinableModel(self._layers, [f"_module_list.{s}" for s in starts])

    def _starts(self, n: int, size: int) -> list[int]:
        """The first layer of stages 1 … size-1."""
        policy = self._policy
        if policy == "uniform":
            base, extra = divmod(n, size)
            bounds = list(itertools.accumulate(base + (p >= size - extra) for p in range(size)))
            return bounds[:-1]
        if policy == "balanced":
            return _balanced([sum(p.numel() for p in layer.parameters()) for layer in self._layers], size)
        if policy == "customized":
            if len(self._split_after) != size - 1:
                raise ConfigError(
                    f"the customized policy found {len(self._split_after)} SPLIT_NODE marks in exec_seq for {size} "
                    f"stages: give {size - 1}"
                )
            return list(self._split_after)
        if isinstance(policy, dict):
            ranges = [policy.get(stage) for stage in range(size)]
            if any(r is None or len(r) != 1 for r in ranges) or ranges[0][0][0] != 0:  # type: ignore[index]
                raise ConfigError(f"a dict policy needs one (start, end) range per stage 0…{size - 1}, got {policy}")
            spans = [r[0] for r in ranges]  # type: ignore[index]
            if any(a[1] != b[0] for a, b in itertools.pairwise(spans)) or spans[-1][1] != n:
                raise ConfigError(f"the dict policy's ranges {spans} must cover the {n} layers contiguously, in order")
            return [start for start, _ in spans[1:]]
        raise ConfigError(f"policy {policy!r}: use 'balanced', 'uniform', 'customized' or a dict of ranges")


def _balanced(weights: list[int], size: int) -> list[int]:
    """Stage starts giving each stage about ``total / size`` of the weights (every stage non-empty)."""
    total = sum(weights)
    prefix = list(itertools.accumulate(weights))
    starts: list[int] = []
    for stage in range(1, size):
        target = total * stage / size
        lowest = (starts[-1] if starts else 0) + 1
        highest = len(weights) - (size - stage)
        best = min(range(lowest, highest + 1), key=lambda i: abs(prefix[i - 1] - target))
        starts.append(best)
    return starts
