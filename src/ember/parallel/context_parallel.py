"""Context (sequence) parallelism: every sequence split across the ranks of the ``"context"`` group.

``parallel = dict(context=N)`` (or ``context=dict(size=N, seq_dim=1, load_balance=True)``) makes
``ember.initialize`` do three things, and the user's model stays as it is:

* **Batches.** Each loader ``initialize`` returns gives every context rank its slice of every
  sequence in the batch, inputs and labels alike (:class:`SequenceSharding`): a tensor is cut
  along ``seq_dim`` (dim 1, batch-first, by default) when it has more dimensions than that; a
  ``{key or position: dim or None}`` mapping overrides it per entry. Sequence lengths must cut
  into equal chunks (``2 × N`` zig-zag, ``N`` contiguous): ember refuses, it never pads.
* **Attention.** During the Engine's forward pass (and where ember's activation checkpointing
  recomputes a block in the backward pass) a :class:`~torch.overrides.TorchFunctionMode` sends every
  ``torch.nn.functional.scaled_dot_product_attention`` call to :func:`~ember.parallel.ring.ring_attention`:
  exact attention over the whole sequence, causal or not. A forward pass that made no SDPA
  call, ``nn.MultiheadAttention``, attention masks, attention dropout and SDPA under
  ``torch.no_grad`` inside a training forward (reentrant ``torch.utils.checkpoint``) are refused.
* **Losses and gradients.** The criterion's (scalar) loss is averaged over the context group —
  the mean over the whole sequence when every rank's slice counts the same number of tokens —
  and the gradients are averaged over the data × context ranks after each accumulation cycle
  (:class:`~ember.parallel.context_policy.ContextPolicy`), tensor-parallel shards included.

Positions: with the default zig-zag split a rank's tokens are two non-adjacent runs of the
sequence, so a model that numbers its tokens with ``torch.arange(T)`` must ask
:func:`positions` instead (the same numbers when nothing is split), or take position ids in the
batch (they are sliced like every other sequence tensor).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ember import context as _context
from ember.errors import DataError, EngineError
from ember.logging import get_dist_logger
from ember.parallel.ring import SequenceSplit, gather_sequence, ring_attention

__all__ = [
    "ContextLoss",
    "ContextParallel",
    "SequenceSharding",
    "gather",
    "launched_sharding",
    "positions",
    "recompute_context",
    "shard_batch",
]

SeqDim = int | Mapping[Any, int | None]
"""``parallel.context.seq_dim``: one dim for every tensor, or ``{key or position: dim or None}``."""


@dataclass(frozen=True)
class SequenceSharding:
    """How this rank's sequences are split, sliced and put back together under context parallelism.

    Attributes:
        group: the ``"context"`` process group.
        split: which tokens of each sequence this rank holds.
        seq_dim: where a batch's sequence dims are (``parallel.context.seq_dim``).

    Example:
        >>> sharding = SequenceSharding(ember.context.get_group("context"), split, seq_dim=1)
        >>> x_local, y_local = sharding.shard_batch((x, y))
    """

    group: dist.ProcessGroup
    split: SequenceSplit
    seq_dim: SeqDim = 1

    def shard_batch(self, batch: Any) -> Any:
        """This rank's slice of every sequence in ``batch`` (see :func:`shard_batch`)."""
        return shard_batch(batch, self.split, self.seq_dim)

    def wrap_loader(self, loader: Any) -> Any:
        """Make ``loader`` yield this rank's slices: its ``collate_fn`` is wrapped (in place; a
        loader prepared twice is wrapped once)."""
        if loader is None:
            return None
        inner = loader.collate_fn
        if isinstance(inner, ShardingCollate):
            inner = inner.collate
        loader.collate_fn = ShardingCollate(inner, self.split, self.seq_dim)
        return loader

    def wrap_criterion(self, criterion: Any) -> Any:
        """``criterion`` whose scalar loss is averaged over the context group (None stays None)."""
        return None if criterion is None else ContextLoss(criterion, self.group)

    @contextlib.contextmanager
    def attention(self, local_length: int | None = None) -> Iterator[_Router]:
        """Send SDPA calls to the ring and make :func:`positions` answer for this split, inside."""
        router = _Router(self, local_length)
        token = _ACTIVE.set(router)
        try:
            with router:
                yield router
        finally:
            _ACTIVE.reset(token)


@dataclass
class ShardingCollate:
    """A DataLoader ``collate_fn``: the loader's own, then :func:`shard_batch` (picklable for workers)."""

    collate: Callable[[list[Any]], Any]
    split: SequenceSplit
    seq_dim: SeqDim

    def __call__(self, samples: list[Any]) -> Any:
        return shard_batch(self.collate(samples), self.split, self.seq_dim)


def shard_batch(batch: Any, split: SequenceSplit, seq_dim: SeqDim = 1) -> Any:
    """This rank's slice of every sequence tensor in ``batch``.

    With an int ``seq_dim``, every tensor with more than ``seq_dim`` dimensions is cut along it
    (so per-sample labels of shape ``(batch,)`` stay whole); tensors sit in tuples, lists,
    namedtuples and dicts, nested. A mapping gives the dim (or None: keep whole) per top-level
    key of a dict batch or position of a tuple/list batch; entries it does not name use dim 1.

    Args:
        batch: what the loader's collate function returned.
        split: which tokens this rank keeps.
        seq_dim: as above (``parallel.context.seq_dim``).

    Returns:
        The batch with the same structure, sequence tensors cut.

    Raises:
        DataError: a sequence length that does not cut into the split's chunks (ember does not
            pad), or cut tensors of different sequence lengths (the message names them and the
            ``seq_dim`` entry that would keep one whole).

    Example:
        >>> shard_batch({"input_ids": ids, "labels": labels}, SequenceSplit(2, 0))["input_ids"].shape
        torch.Size([8, 512])         # ids of shape (8, 1024)
    """
    lengths: dict[str, int] = {}
    if isinstance(seq_dim, Mapping):
        items = batch.items() if isinstance(batch, Mapping) else enumerate(batch)
        dims = {key: seq_dim.get(key, 1) for key, _ in items}
        if isinstance(batch, Mapping):
            return {k: _cut(v, split, dims[k], f"batch[{k!r}]", lengths) for k, v in batch.items()}
        cut = [_cut(v, split, dims[i], f"batch[{i}]", lengths) for i, v in enumerate(batch)]
        return type(batch)(*cut) if hasattr(batch, "_fields") else type(batch)(cut)
    return _cut(batch, split, seq_dim, "batch", lengths)


def _cut(value: Any, split: SequenceSplit, dim: int | None, where: str, lengths: dict[str, int]) -> Any:
    if isinstance(value, torch.Tensor):
        if dim is None or value.dim() <= dim:
            return value
        length = value.size(dim)
        for other, seen in lengths.items():
            if seen != length:
                raise DataError(
                    f"context parallelism cuts {other} and {where} along their sequence dims, but their lengths "
                    f"differ ({seen} and {length}, shape {tuple(value.shape)}): set parallel.context.seq_dim to a "
                    f"mapping that keeps the one that is not a sequence whole, e.g. seq_dim={{key or position: None}}"
                )
        lengths[where] = length
        split.check_length(length, f"{where} (shape {tuple(value.shape)}, sequence dim {dim})")
        return split.shard(value, dim)
    if isinstance(value, Mapping):
        return {k: _cut(v, split, dim, f"{where}[{k!r}]", lengths) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        cut = [_cut(v, split, dim, f"{where}[{i}]", lengths) for i, v in enumerate(value)]
        return type(value)(*cut) if hasattr(value, "_fields") else type(value)(cut)
    return value


# -- attention ---------------------------------------------------------------------------------

_ACTIVE: contextvars.ContextVar[_Router | None] = contextvars.ContextVar("ember_context_parallel", default=None)


class _Router(TorchFunctionMode):
    """Sends SDPA to the ring; refuses what the ring cannot compute exactly; counts the calls."""

    def __init__(self, sharding: SequenceSharding, local_length: int | None) -> None:
        super().__init__()
        self.sharding = sharding
        self.local_length = local_length
        self.calls = 0
        self.quiet = False  # positions() builds its own aranges
        self.training = torch.is_grad_enabled()  # a forward pass that will be back-propagated

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            self.calls += 1
            return self._attention(*args, **kwargs)
        if func is F.multi_head_attention_forward:
            raise EngineError(
                "nn.MultiheadAttention under context parallelism (parallel.context): ember splits the sequence and "
                "computes attention exactly only through torch.nn.functional.scaled_dot_product_attention; write "
                "the attention with SDPA (q, k, v projections, then scaled_dot_product_attention(q, k, v, ...))"
            )
        result = func(*args, **kwargs)
        if func is torch.arange and not self.quiet:
            _warn_arange(result, self.local_length)
        return result

    def _attention(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
    ) -> torch.Tensor:  # fmt: skip
        if self.training and not torch.is_grad_enabled():
            raise EngineError(
                "scaled_dot_product_attention ran without gradients inside a training forward pass under context "
                "parallelism: torch.utils.checkpoint(..., use_reentrant=True) does this, and its recomputation in the "
                "backward pass would attend to this rank's slice only. Use ember's activation checkpointing "
                "(config activation_checkpointing=..., or ember.parallel.checkpointing.checkpoint) instead"
            )
        if attn_mask is not None:
            raise EngineError(
                f"scaled_dot_product_attention got an attn_mask of shape {tuple(attn_mask.shape)} under context "
                "parallelism: a mask built from this rank's slice of the sequence cannot be split across the ring. "
                "Use is_causal=True for causal attention (padding: pad with the loss's ignore_index instead of masking)"
            )
        if dropout_p:
            raise EngineError(
                f"scaled_dot_product_attention got dropout_p={dropout_p} under context parallelism: ember's ring "
                "attention has no attention dropout; pass dropout_p=0.0 (dropout on the attention's output works)"
            )
        if enable_gqa and key.size(-3) != query.size(-3):  # grouped-query attention: repeat the shared heads
            repeat = query.size(-3) // key.size(-3)
            key, value = key.repeat_interleave(repeat, -3), value.repeat_interleave(repeat, -3)
        if torch.is_autocast_enabled("cpu"):  # as SDPA itself runs under CPU autocast
            dtype = torch.get_autocast_dtype("cpu")
            query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
        lead = query.shape[:-2]
        q, k, v = (t.reshape(-1, 1, *t.shape[-2:]) if t.dim() != 4 else t for t in (query, key, value))
        out = ring_attention(q, k, v, self.sharding.group, self.sharding.split, is_causal=is_causal, scale=scale)
        return out.reshape(*lead, *out.shape[-2:])


def _warn_arange(result: Any, local_length: int | None) -> None:
    """A one-time warning when the model numbers this rank's tokens from 0 (wrong positions)."""
    global _WARNED_ARANGE
    if _WARNED_ARANGE or local_length is None or not isinstance(result, torch.Tensor):
        return
    if result.dim() == 1 and result.numel() == local_length and local_length > 1 and int(result[0]) == 0:
        _WARNED_ARANGE = True
        get_dist_logger().warning(
            f"torch.arange({local_length}) ran in a context-parallel forward pass, where {local_length} is this rank's "
            "slice of the sequence: if it numbers positions, they are wrong on every rank but the first (the slices "
            "are not the sequence's start); use ember.parallel.context_parallel.positions(length, device) instead",
            ranks=[0],
        )


_WARNED_ARANGE = False


def positions(length: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The positions in the whole sequence of this rank's ``length`` tokens: use it where a model
    writes ``torch.arange(length)`` for position embeddings or rotary angles.

    Inside a context-parallel forward pass it follows the split (zig-zag: two runs); anywhere
    else — one process, no ``parallel.context``, outside the Engine — it is ``torch.arange(length)``.

    Args:
        length: the number of tokens this rank holds (the input's sequence length).
        device: where to create them.

    Returns:
        An int64 tensor of ``length`` positions.

    Example:
        >>> pos = positions(idx.size(1), idx.device)     # was: torch.arange(idx.size(1), device=idx.device)
        >>> x = self.wte(idx) + self.wpe(pos)
    """
    router = _ACTIVE.get()
    if router is None:
        return torch.arange(length, device=device)
    router.quiet = True
    try:
        return router.sharding.split.positions(length, device)
    finally:
        router.quiet = False


def recompute_context() -> contextlib.AbstractContextManager[Any] | None:
    """The context a block that activation checkpointing recomputes in the backward pass must run
    in: SDPA sent to the ring again when this forward pass sends it there, else None.

    Call it in the forward pass (torch's ``checkpoint(..., context_fn=...)`` does); ember's
    activation checkpointing passes it for you.
    """
    router = _ACTIVE.get()
    return None if router is None else _Reentry(router.sharding, router.local_length)


class _Reentry:
    """:meth:`SequenceSharding.attention`, entered anew each time (a graph back-propagated twice
    with ``retain_graph=True`` recomputes twice)."""

    def __init__(self, sharding: SequenceSharding, local_length: int | None) -> None:
        self.sharding, self.local_length = sharding, local_length
        self.entered: list[contextlib.AbstractContextManager[Any]] = []

    def __enter__(self) -> None:
        context = self.sharding.attention(self.local_length)
        context.__enter__()
        self.entered.append(context)

    def __exit__(self, *exc: Any) -> None:
        self.entered.pop().__exit__(*exc)


def gather(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """The whole sequence from every rank's slice, in position order (differentiable): for what
    needs all of it, e.g. pooling over the sequence. ``x`` itself outside a context-parallel forward pass.

    Example:
        >>> pooled = gather(hidden, dim=1).mean(dim=1)      # the same on every context rank
    """
    router = _ACTIVE.get()
    if router is None:
        return x
    return gather_sequence(x, dim, router.sharding.group, router.sharding.split)


class ContextParallel(nn.Module):
    """The module the Engine's forward runs through under context parallelism: the user's model
    (or its DDP/compiled wrapper) called with SDPA sent to the ring (:meth:`SequenceSharding.attention`).

    Args:
        module: what to run.
        sharding: the split, its group and where the sequence dims are.

    Raises:
        EngineError: (when called) the forward pass made no ``scaled_dot_product_attention`` call:
            hand-written attention would see this rank's keys only.
    """

    def __init__(self, module: nn.Module, sharding: SequenceSharding) -> None:
        super().__init__()
        self.module = module
        self.sharding = sharding

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.sharding.attention(_local_length(args, kwargs, self.sharding.seq_dim)) as router:
            out = self.module(*args, **kwargs)
        if router.calls == 0:
            raise EngineError(
                f"{type(self.module).__name__}'s forward pass made no torch.nn.functional.scaled_dot_product_attention "
                "call under context parallelism (parallel.context): each rank holds a slice of the sequence, and "
                "attention written by hand (softmax(q @ k.T) @ v) would see this rank's keys only. Compute attention "
                "with scaled_dot_product_attention, or remove parallel.context"
            )
        return out


def _local_length(args: tuple[Any, ...], kwargs: dict[str, Any], seq_dim: SeqDim) -> int | None:
    """The sequence length of the first input tensor (for the positions warning); None if unknown."""
    if not isinstance(seq_dim, int):
        return None
    first = next((t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor) and t.dim() > seq_dim), None)
    return None if first is None else int(first.size(seq_dim))


def launched_sharding() -> SequenceSharding | None:
    """The launched job's sequence sharding (``parallel.context`` of the launch config), or None
    without context parallelism: for layers that read the launched layout when they are built or
    run (Colossal-AI's ring self-attention).

    Example:
        >>> sharding = launched_sharding()          # after ember.launch_from_torch(config=...)
        >>> k_full = gather_sequence(k, 1, sharding.group, sharding.split)
    """
    ctx = _context.get_context(default=True)
    if ctx.layout.context == 1:
        return None
    section = ctx.config.parallel.context if ctx.config is not None else {}
    split = SequenceSplit(ctx.layout.context, ctx.coords["context"], bool(section.get("load_balance", True)))
    group = _context.get_group("context")
    if group is None:  # unreachable: a layout with context > 1 has the group
        raise EngineError("the launched layout splits the sequence but has no context group")
    return SequenceSharding(group, split, section.get("seq_dim", 1))


# -- losses and gradients -------------------------------------------------------------------------


class _ContextMean(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, loss: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=group)
        return mean.div_(dist.get_world_size(group))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        # Each rank back-propagates its own slice's loss with weight 1, as data-parallel replicas
        # do; the gradient average over data × context (context_policy) makes it the mean's gradient.
        return grad, None


@dataclass
class ContextLoss:
    """The user's criterion, its scalar loss averaged over the context group (value only; see
    :class:`~ember.parallel.context_policy.ContextPolicy` for the gradient). Losses that are not
    scalars pass unchanged."""

    criterion: Callable[..., Any]
    group: dist.ProcessGroup

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        loss = self.criterion(*args, **kwargs)
        if isinstance(loss, torch.Tensor) and loss.dim() == 0:
            return _ContextMean.apply(loss, self.group)
        return loss
