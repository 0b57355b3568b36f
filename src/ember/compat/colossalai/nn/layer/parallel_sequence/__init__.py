"""Colossal-AI's ``colossalai.nn.layer.parallel_sequence``: ring self-attention on ember's context parallelism.

``parallel=dict(tensor=dict(size=N, mode="sequence"))`` in a Colossal-AI config is ember's
``parallel.context = dict(size=N, load_balance=False)``: each rank holds the r-th contiguous
slice of every sequence, as Colossal-AI's sequence parallelism cuts them. ``RingQK``, ``RingAV``
and ``TransformerSelfAttentionRing`` compute what Colossal-AI's do over ember's ``"context"``
group, with exact gradients (Colossal-AI's backward divides the query/key gradients by N once
too often on a CPU).
"""

from __future__ import annotations

from ._operation import RingAV, RingQK
from .layers import AttnMaskType, TransformerSelfAttentionRing

__all__ = ["AttnMaskType", "RingAV", "RingQK", "TransformerSelfAttentionRing"]
