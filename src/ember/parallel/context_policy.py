"""The Engine's side of context parallelism: what it runs with, how it is built, and the policy
that averages gradients over the data × context ranks (:mod:`ember.parallel.context_parallel`
has the attention, the batches and the positions)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ember import context as _context
from ember.errors import ConfigError, EngineError
from ember.parallel.context_parallel import ContextParallel, SequenceSharding
from ember.parallel.policy import ShardedPolicy, all_reduce_mean, local_part
from ember.parallel.ring import SequenceSplit

__all__ = ["UNSUPPORTED", "ContextPolicy", "check_context", "context_parallelized"]


class ContextPolicy(ShardedPolicy):
    """The Engine's policy under context parallelism (with data and/or 1-D tensor parallelism).

    After the backward that closes an accumulation cycle, every gradient — a tensor-parallel
    one's local shard — is averaged over the data × context group. Clipping and state are
    :class:`ShardedPolicy`'s (full state on rank 0); partial gradients of an open cycle differ
    per rank and are not saved.

    Args:
        sharding: the split and the context group.
        params: the parameters whose gradients are averaged (the optimizer's).
        group: the data × context group (``ember.context.get_group("data_context")``).
        description: what was built, for the log.
    """

    def __init__(
        self, sharding: SequenceSharding, params: list[nn.Parameter], group: dist.ProcessGroup, description: str
    ) -> None:
        super().__init__(None, description)
        self.sharding = sharding
        self.params = params
        self.group = group

    @contextlib.contextmanager
    def gradient_sync(self, enabled: bool) -> Iterator[None]:
        yield
        if enabled:
            all_reduce_mean([local_part(p.grad) for p in self.params if p.grad is not None], self.group)


# -- building ---------------------------------------------------------------------------------------

UNSUPPORTED = (
    "pipeline parallelism, zero stages 1-3, the 2-D/2.5-D/3-D tensor modes, expert parallelism, compile together "
    "with activation checkpointing"
)
"""What context parallelism does not combine with yet, for the error messages."""


def check_context(
    layout: Any,
    zero_stage: int,
    pipelined: bool,
    compiled_checkpoints: bool = False,
    device: torch.device | None = None,
) -> None:
    """Refuse what context parallelism does not run with, before any collective.

    Raises:
        ConfigError: a combination in :data:`UNSUPPORTED`; ``compile`` together with activation
            checkpointing (``compiled_checkpoints``: torch.compile cannot trace the context the
            recomputed attention needs); a device other than the CPU (on CUDA context
            parallelism is torch's own, which ember does not wire yet).
    """
    clash = [
        text
        for text, asked in {
            f"parallel.pipeline.size={layout.pipeline}": pipelined,
            f"zero.stage={zero_stage}": zero_stage > 0,
            f"parallel.tensor.mode={layout.tensor_mode!r}": layout.tensor_mode != "1d",
            f"parallel.expert={layout.expert}": layout.expert > 1,
            "compile together with activation_checkpointing": compiled_checkpoints,
        }.items()
        if asked
    ]
    if clash:
        raise ConfigError(
            f"config parallel.context={layout.context} cannot be combined with {', '.join(clash)} in this ember "
            f"version: context parallelism runs alone, × data (parallel.data) and × 1-D tensor parallelism "
            f"(parallel.tensor); not with {UNSUPPORTED}"
        )
    if device is not None and device.type != "cpu":
        raise ConfigError(
            f"config parallel.context={layout.context} on {device.type}: ember's ring attention runs on the CPU "
            "(gloo); on CUDA, context parallelism is torch's torch.distributed.tensor.experimental.context_parallel, "
            "which ember does not wire into the Engine yet (docs/parallel.md, 'Context parallelism'): run on the "
            "CPU, or use torch's context_parallel in your own loop"
        )


def context_parallelized(
    module: nn.Module, optimizer: torch.optim.Optimizer, section: Mapping[str, Any], layout: Any, built: list[str]
) -> tuple[nn.Module, ContextPolicy, SequenceSharding]:
    """The forward module, policy and batch sharding of a context-parallel Engine.

    Args:
        module: what the forward runs (the model, tensor-parallel or compiled as asked).
        optimizer: the optimizer that steps.
        section: the config's ``parallel.context`` section (``size``, ``seq_dim``, ``load_balance``).
        layout: the Engine's :class:`~ember.layout.ParallelLayout` (its groups exist: a collective built them).
        built: what was built before (for the policy's name).

    Returns:
        ``(forward module, policy, sharding)``: the Engine runs both its training and evaluation
        forward through the first.
    """
    context_group = _context.get_group("context", layout)
    replicas = _context.get_group("data_context", layout)
    if context_group is None or replicas is None:  # unreachable: context > 1 has both groups
        raise EngineError(f"{layout} has no context or data_context group")
    rank = layout.coords(_context.get_context(default=True).rank)["context"]
    split = SequenceSplit(layout.context, rank, bool(section.get("load_balance", True)))
    sharding = SequenceSharding(context_group, split, section.get("seq_dim", 1))
    params = [p for g in optimizer.param_groups for p in g["params"]]
    how = "zig-zag" if split.balanced else "contiguous"
    name = " + ".join([*built, f"context parallel ×{split.size} ({how})"])
    return ContextParallel(module, sharding), ContextPolicy(sharding, params, replicas, name), sharding
