"""Ring attention: exact attention over a sequence split across the ranks of a process group.

Each of the N ranks of the context group holds a slice of every sequence (:class:`SequenceSplit`
says which tokens). Attention for the local queries needs every rank's keys and values, so they
travel around the ring (rank r sends to r + 1 and receives from r - 1), one slice per step,
while each step's partial result is merged into the output with an online softmax: the output
and the log-sum-exp of each query row are rescaled as new key blocks arrive (Liu et al. 2023,
*Ring Attention*; the merge is the one flash attention uses between tiles). Nothing of size
sequence × sequence is ever held, and no rank holds more than two key/value slices.

The backward pass runs the same ring: the key/value slices travel again, each with an
accumulator of its gradient that collects every rank's contribution and arrives back at its
owner after the last step. Each block's gradients come from torch's own attention backward
kernel, given the *global* output and log-sum-exp of its query rows, so the sum over blocks is
the exact gradient of one-process attention (up to float rounding): nothing is divided by the
ring size (Colossal-AI's ring self-attention divides the query/key gradients by it once too
often when run on a CPU).

Causal attention is load-balanced when the split is :attr:`SequenceSplit.balanced` (zig-zag,
as torch's context parallelism does): the sequence is cut into 2N chunks and rank r holds chunks
r and 2N - 1 - r, so every rank does the same share of the triangle:

=====================  ===========================================================
keys/values from rank  what rank r computes with them (causal, balanced split)
=====================  ===========================================================
r itself               its queries against its keys, causally (positions increase)
j < r                  all its queries against the first half of j's keys
j > r                  the second half of its queries against all of j's keys
=====================  ===========================================================

With a contiguous split, rank r uses rank j's keys in full for j < r, causally for j = r, and
skips j > r. Without a causal mask every block is used in full, whatever the split.

The block kernels are torch's CPU flash-attention operators
(``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward), which return the
log-sum-exp the merge needs; on CUDA, context parallelism is torch's own
(``torch.distributed.tensor.experimental.context_parallel``), see ``docs/parallel.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ember.errors import DataError, EngineError

__all__ = ["SequenceSplit", "gather_sequence", "ring_attention"]

_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
_KV_TAG, _GRAD_TAG = 1, 2  # the key/value slices and their gradients travel between the same ranks


@dataclass(frozen=True)
class SequenceSplit:
    """Which tokens of each sequence a rank of the context group holds.

    Attributes:
        size: the number of ranks the sequence is split over (``parallel.context.size``).
        rank: this rank's place in the context group.
        balanced: zig-zag (``parallel.context.load_balance``): the sequence is cut into
            ``2 * size`` equal chunks and rank r holds chunks r and ``2 * size - 1 - r``, in
            that order; False: rank r holds the r-th of ``size`` contiguous chunks.

    Example:
        >>> split = SequenceSplit(size=2, rank=1, balanced=True)
        >>> split.positions(4).tolist()         # a sequence of 8 tokens, cut 2 | 2 | 2 | 2
        [2, 3, 4, 5]
        >>> split.shard(torch.arange(8), dim=0).tolist()
        [2, 3, 4, 5]
    """

    size: int
    rank: int
    balanced: bool = True

    @property
    def chunks(self) -> int:
        """How many equal chunks a sequence is cut into: ``2 * size`` balanced, else ``size``."""
        return 2 * self.size if self.balanced else self.size

    def held(self, rank: int | None = None) -> tuple[int, ...]:
        """The chunks (indices in the sequence's order) that ``rank`` (default: this one) holds."""
        r = self.rank if rank is None else rank
        return (r, self.chunks - 1 - r) if self.balanced else (r,)

    def check_length(self, length: int, what: str) -> None:
        """Refuse a sequence length that does not cut into :attr:`chunks` equal chunks.

        Raises:
            DataError: naming ``what``, the length and the lengths that fit.
        """
        if length % self.chunks:
            below, above = length - length % self.chunks, length + self.chunks - length % self.chunks
            how = f"2 × {self.size} chunks (zig-zag, load_balance=True)" if self.balanced else f"{self.size} chunks"
            raise DataError(
                f"{what} has sequence length {length}, which context parallelism over {self.size} ranks cannot cut "
                f"into {how}: ember refuses rather than pads. Pad or crop the sequences to a multiple of "
                f"{self.chunks} (e.g. {below or self.chunks} or {above}; padded labels set to the loss's "
                "ignore_index)" + (", or set parallel.context.load_balance=False" if self.balanced else "")
            )

    def shard(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's slice of ``tensor``, a whole sequence along ``dim`` (a copy when balanced)."""
        length = tensor.size(dim)
        self.check_length(length, f"a tensor of shape {tuple(tensor.shape)} (sequence dim {dim})")
        chunk = length // self.chunks
        parts = [tensor.narrow(dim, c * chunk, chunk) for c in self.held()]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim)

    def positions(self, local_length: int, device: torch.device | str | None = None) -> torch.Tensor:
        """The positions in the whole sequence of this rank's ``local_length`` tokens (int64)."""
        held = self.held()
        if local_length % len(held):
            raise EngineError(
                f"a local sequence of {local_length} tokens cannot be a zig-zag slice (two equal halves): "
                "pass the length of this rank's slice of the sequence"
            )
        chunk = local_length // len(held)
        return torch.cat([torch.arange(c * chunk, (c + 1) * chunk, device=device) for c in held])

    def unshard(self, parts: list[torch.Tensor], dim: int) -> torch.Tensor:
        """The whole sequence from every rank's slice (``parts`` in group-rank order)."""
        halves = [p.chunk(2, dim) if self.balanced else (p,) for p in parts]
        ordered: list[torch.Tensor | None] = [None] * self.chunks
        for r, pieces in enumerate(halves):
            for c, piece in zip(self.held(r), pieces, strict=True):
                ordered[c] = piece
        return torch.cat([p for p in ordered if p is not None], dim)


@dataclass(frozen=True)
class _Ring:
    """The context group as the ring needs it: the split, and the global ranks of the neighbours."""

    group: dist.ProcessGroup
    split: SequenceSplit
    send_to: int
    receive_from: int

    @classmethod
    def of(cls, group: dist.ProcessGroup, split: SequenceSplit) -> _Ring:
        size = dist.get_world_size(group)
        if size != split.size or dist.get_rank(group) != split.rank:
            raise EngineError(
                f"the context group has {size} ranks and this is its rank {dist.get_rank(group)}, but the sequence "
                f"split says {split.size} ranks, rank {split.rank}: build the split from the same group"
            )
        after, before = (split.rank + 1) % size, (split.rank - 1) % size
        return cls(group, split, dist.get_global_rank(group, after), dist.get_global_rank(group, before))

    def pass_on(self, tensor: torch.Tensor, tag: int) -> tuple[torch.Tensor, list[Any]]:
        """Start sending ``tensor`` to the next rank and receiving the previous rank's into a new buffer."""
        received = torch.empty_like(tensor)
        works = [
            dist.isend(tensor, self.send_to, group=self.group, tag=tag),
            dist.irecv(received, self.receive_from, group=self.group, tag=tag),
        ]
        return received, works


def _block(ring: _Ring, step: int, causal: bool, q_len: int, kv_len: int) -> tuple[slice, slice, bool] | None:
    """Which query rows meet which key rows at ``step`` (keys from rank ``rank - step``), and
    whether causally; None when the block is entirely masked."""
    everything = slice(None)
    if not causal:
        return everything, everything, False
    if step == 0:
        return everything, everything, True
    source = (ring.split.rank - step) % ring.split.size
    if not ring.split.balanced:
        return (everything, everything, False) if source < ring.split.rank else None
    if source < ring.split.rank:
        return everything, slice(0, kv_len // 2), False
    return slice(q_len // 2, None), everything, False


def _forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: _Ring, causal: bool, scale: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ring's forward pass: the output (in ``q``'s dtype) and the float32 log-sum-exp per query."""
    kv = torch.cat([k.reshape(-1), v.reshape(-1)])
    out: torch.Tensor | None = None
    lse = torch.empty(0)
    for step in range(ring.split.size):
        k_now, v_now = kv[: k.numel()].view_as(k), kv[k.numel() :].view_as(v)
        incoming = ring.pass_on(kv, _KV_TAG) if step < ring.split.size - 1 else None
        block = _block(ring, step, causal, q.size(2), k.size(2))
        if block is not None:
            rows, cols, block_causal = block
            o, o_lse = _FLASH(q[:, :, rows], k_now[:, :, cols], v_now[:, :, cols], 0.0, block_causal, scale=scale)
            if out is None:  # step 0 covers every query row
                out, lse = o.float(), o_lse
            else:
                merged = torch.logaddexp(lse[:, :, rows], o_lse)
                keep, add = torch.exp(lse[:, :, rows] - merged), torch.exp(o_lse - merged)
                out[:, :, rows] = out[:, :, rows] * keep.unsqueeze(-1) + o.float() * add.unsqueeze(-1)
                lse[:, :, rows] = merged
        if incoming is not None:
            kv = _wait(incoming)
    if out is None:  # unreachable: step 0 always computes
        raise EngineError("ring attention computed no block")
    return out.to(q.dtype), lse


def _backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    ring: _Ring, causal: bool, scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """The ring's backward pass: each block's gradients from the global output and log-sum-exp;
    a key/value slice's gradient travels with it and reaches its owner after the last step."""
    dout = dout.contiguous()
    n = k.numel()
    kv = torch.cat([k.reshape(-1), v.reshape(-1)])
    dq = torch.zeros(q.shape, dtype=torch.float32)
    dkv = torch.zeros(kv.shape, dtype=torch.float32)
    for step in range(ring.split.size):
        k_now, v_now = kv[:n].view_as(k), kv[n:].view_as(v)
        incoming = ring.pass_on(kv, _KV_TAG) if step < ring.split.size - 1 else None
        block = _block(ring, step, causal, q.size(2), k.size(2))
        if block is not None:
            rows, cols, block_causal = block
            dq_b, dk_b, dv_b = _FLASH_BACKWARD(
                dout[:, :, rows], q[:, :, rows], k_now[:, :, cols], v_now[:, :, cols], out[:, :, rows],
                lse[:, :, rows], 0.0, block_causal, scale=scale,
            )  # fmt: skip
            dq[:, :, rows] += dq_b
            dkv[:n].view(k.shape)[:, :, cols] += dk_b
            dkv[n:].view(v.shape)[:, :, cols] += dv_b
        # The accumulator goes on with its slice; after the last step it is one hop from home.
        gradients = ring.pass_on(dkv, _GRAD_TAG) if ring.split.size > 1 else None
        if incoming is not None:
            kv = _wait(incoming)
        if gradients is not None:
            dkv = _wait(gradients)
    return dq.to(q.dtype), dkv[:n].view(k.shape).to(k.dtype), dkv[n:].view(v.shape).to(v.dtype)


def _wait(transfer: tuple[torch.Tensor, list[Any]]) -> torch.Tensor:
    received, works = transfer
    for work in works:
        work.wait()
    return received


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: _Ring, causal: bool, scale: float | None
    ) -> torch.Tensor:
        out, lse = _forward(q, k, v, ring, causal, scale)
        # Saved detached, not as the output it is: the output's saved slot is packed at another point,
        # so that activation checkpointing's recomputation would see the saved tensors in another order.
        ctx.save_for_backward(q, k, v, out.detach(), lse)
        ctx.ring, ctx.causal, ctx.scale = ring, causal, scale
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(dout, q, k, v, out, lse, ctx.ring, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None, None


def ring_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    group: dist.ProcessGroup,
    split: SequenceSplit,
    *,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Exact scaled dot-product attention over sequences split across ``group`` (differentiable).

    The same result as ``torch.nn.functional.scaled_dot_product_attention`` on the whole
    sequences, restricted to this rank's query rows (see the module docstring for the ring).
    ember calls it for every SDPA call in the forward pass under ``parallel.context``.

    Args:
        query: ``(batch, heads, local length, head dim)``: this rank's slice, as ``split`` says.
        key: ``(batch, heads, local key length, head dim)``, split the same way.
        value: like ``key``.
        group: the context-parallel process group (``ember.context.get_group("context")``).
        split: which tokens each rank holds; its size and rank must be the group's.
        is_causal: mask each query from the keys after its own position (needs equal query
            and key lengths).
        scale: the softmax scale; default ``1 / sqrt(head dim)``.

    Returns:
        This rank's rows of the attention output, in ``query``'s dtype.

    Raises:
        EngineError: tensors not on the CPU or not 4-D, a causal call with different query and
            key lengths, a split that does not match the group.

    Example:
        >>> split = SequenceSplit(size=2, rank=ember.context.coords["context"])
        >>> out = ring_attention(q, k, v, ember.context.get_group("context"), split, is_causal=True)
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() != 4 or t.device.type != "cpu":
            raise EngineError(
                f"ring attention takes 4-D (batch, heads, length, head dim) CPU tensors; its {name} is {t.dim()}-D "
                f"on {t.device.type}"
            )
    if is_causal and query.size(2) != key.size(2):
        raise EngineError(
            f"causal ring attention needs as many queries as keys per rank, got {query.size(2)} and {key.size(2)}"
        )
    if key.dtype != query.dtype or value.dtype != query.dtype:
        key, value = key.to(query.dtype), value.to(query.dtype)
    out: torch.Tensor = _RingAttention.apply(query, key, value, _Ring.of(group, split), is_causal, scale)
    return out


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: dist.ProcessGroup, split: SequenceSplit) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(split.size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        ctx.dim, ctx.group, ctx.split = dim, group, split
        return split.unshard(parts, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        # Every rank's loss used the whole sequence: a slice's gradient is the sum of theirs.
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)
        return ctx.split.shard(total, ctx.dim), None, None, None


def gather_sequence(x: torch.Tensor, dim: int, group: dist.ProcessGroup, split: SequenceSplit) -> torch.Tensor:
    """The whole sequence on every rank, in position order, from each rank's slice (differentiable).

    For what needs the whole sequence, e.g. pooling over it: the gradient of each slice is the
    sum over the ranks of theirs (each rank's loss counts once, as data-parallel replicas do).

    Args:
        x: this rank's slice; its size along ``dim`` is the local length.
        dim: the sequence dimension.
        group: the context-parallel process group.
        split: which tokens each rank holds.

    Returns:
        The sequence of ``split.size`` times the local length along ``dim``.

    Example:
        >>> pooled = gather_sequence(hidden, 1, ember.context.get_group("context"), split).mean(dim=1)
    """
    out: torch.Tensor = _GatherSequence.apply(x, dim, group, split)
    return out
