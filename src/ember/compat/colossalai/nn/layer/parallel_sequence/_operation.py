"""Colossal-AI's ``RingQK`` and ``RingAV``: the attention scores of this rank's queries against
every rank's keys, and those scores applied to every rank's values.

Colossal-AI passes the key and value slices around the ring by hand and writes each block of
the result in place; here every slice is gathered once along the sequence
(:func:`ember.parallel.ring.gather_sequence`, whose backward sums each slice's gradient over
the ranks) and the products are ordinary matmuls, so autograd gives the exact gradients.
"""

from __future__ import annotations

import torch

from ember.errors import ContextError
from ember.parallel.context_parallel import SequenceSharding, launched_sharding
from ember.parallel.ring import gather_sequence

__all__ = ["RingAV", "RingQK"]


def _sharding() -> SequenceSharding:
    sharding = launched_sharding()
    if sharding is None:
        raise ContextError(
            "Colossal-AI's ring attention needs sequence parallelism: launch with "
            "parallel=dict(tensor=dict(size=N, mode='sequence')) (ember's parallel.context=N)"
        )
    return sharding


def _whole(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``[batch × heads, local length, ...]`` gathered to the whole sequence along dim 1."""
    sharding = _sharding()
    return gather_sequence(x, 1, sharding.group, sharding.split)


class RingQK:
    """Attention scores ``sub_q @ K.T`` of this rank's queries against the whole sequence's keys.

    Example:
        >>> scores = RingQK.apply(q, k, batch_size, num_heads, sub_seq_length)   # [b*h, sub_seq, seq]
    """

    @staticmethod
    def apply(
        sub_q: torch.Tensor, sub_k: torch.Tensor, batch_size: int, num_attention_heads: int, sub_seq_length: int
    ) -> torch.Tensor:
        """Args:
            sub_q: ``[batch × heads, sub_seq_length, head size]``, this rank's queries.
            sub_k: the same shape, this rank's keys.
            batch_size: the batch size (kept for Colossal-AI's signature).
            num_attention_heads: the number of heads (likewise).
            sub_seq_length: this rank's sequence length.

        Returns:
            ``[batch × heads, sub_seq_length, sequence length]``, columns in sequence order.
        """
        return torch.matmul(sub_q, _whole(sub_k).transpose(2, 1))


class RingAV:
    """This rank's attention output: its rows of the scores applied to the whole sequence's values.

    Example:
        >>> context = RingAV.apply(probs, v, batch_size, num_heads, head_size, sub_seq_length)
    """

    @staticmethod
    def apply(
        attention_score: torch.Tensor, sub_v: torch.Tensor, batch_size: int, num_attention_heads: int,
        attention_head_size: int, sub_seq_length: int,
    ) -> torch.Tensor:  # fmt: skip
        """Args:
            attention_score: ``[batch × heads, sub_seq_length, sequence length]``.
            sub_v: ``[batch × heads, sub_seq_length, head size]``, this rank's values.
            batch_size: the batch size (kept for Colossal-AI's signature).
            num_attention_heads: the number of heads (likewise).
            attention_head_size: the head size (likewise).
            sub_seq_length: this rank's sequence length.

        Returns:
            ``[batch × heads, sub_seq_length, head size]``.
        """
        return torch.matmul(attention_score, _whole(sub_v))
