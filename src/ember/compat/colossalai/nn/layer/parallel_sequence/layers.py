"""Colossal-AI's ``TransformerSelfAttentionRing``: Megatron-style self-attention over a sequence
split across the ranks of the sequence-parallel group, the same parameters and arithmetic.

The arithmetic is Colossal-AI's unfused (CPU) path: a fused query/key/value Linear, scores from
:class:`~.RingQK` divided by ``sqrt(hidden_size)`` (times ``layer_number`` with
``apply_query_key_layer_scaling``, which the softmax multiplies back), the mask applied with
``attention_mask_func``, softmax, dropout, :class:`~.RingAV`, and the output Linear whose bias is
returned beside its output (``skip_bias_add``). A ``causal`` mask type without a mask masks by the
tokens' positions in the whole sequence; Colossal-AI's unfused path applies only the mask given.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ember.errors import ConfigError

from ._operation import RingAV, RingQK, _sharding

__all__ = ["AttnMaskType", "TransformerSelfAttentionRing"]


class AttnMaskType(enum.Enum):
    """Colossal-AI's attention mask types (``colossalai.kernel.cuda_native.scaled_softmax``)."""

    padding = 1
    causal = 2


class _Linear(nn.Module):
    """Colossal-AI's sequence-parallel ``_Linear``: Xavier-normal weight, zero bias, optionally
    returning the bias beside the output instead of adding it."""

    def __init__(self, input_size: int, output_size: int, bias: bool = True, skip_bias_add: bool = False) -> None:
        super().__init__()
        self.input_size, self.output_size, self.skip_bias_add = input_size, output_size, skip_bias_add
        self.weight = nn.Parameter(torch.empty(output_size, input_size))
        nn.init.xavier_normal_(self.weight)
        self.bias = nn.Parameter(torch.zeros(output_size)) if bias else None

    def forward(self, x: torch.Tensor) -> Any:
        if self.skip_bias_add:
            return nn.functional.linear(x, self.weight), self.bias
        return nn.functional.linear(x, self.weight, self.bias)


class TransformerSelfAttentionRing(nn.Module):
    """Self-attention on ``[sub_seq_len, batch, hidden]`` slices of a sequence split over the
    sequence-parallel ranks (contiguously: rank r holds the r-th slice).

    Args:
        hidden_size: the hidden size (a multiple of ``num_attention_heads``).
        num_attention_heads: the number of heads.
        attention_dropout: dropout on the attention probabilities.
        attention_mask_func: ``fn(scores, mask) -> masked scores`` (e.g. ``scores.masked_fill_(mask, -10000.0)``).
        layer_number: the layer's index, from 1 (the scale under ``apply_query_key_layer_scaling``).
        apply_query_key_layer_scaling: divide the scores by ``layer_number`` more, and the softmax
            multiplies them back (in fp32).
        convert_fp16_to_fp32_in_softmax: compute the softmax in fp32 for fp16/bf16 scores.
        attn_mask_type: :class:`AttnMaskType` (or its name or value).
        masked_softmax_fusion: accepted; ember has no fused CUDA softmax (the unfused arithmetic).
        fp16: the scores are fp16.
        bf16: the scores are bf16.

    Example:
        >>> attn = TransformerSelfAttentionRing(512, 8, 0.1, mask_func, layer_number=1)
        >>> out, bias = attn(hidden_states, attention_mask)   # [s/N, b, h], [b, 1, s/N, s]
    """

    def __init__(
        self,
        hidden_size: int,
        num_attention_heads: int,
        attention_dropout: float,
        attention_mask_func: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        layer_number: int,
        apply_query_key_layer_scaling: bool = False,
        convert_fp16_to_fp32_in_softmax: bool = False,
        attn_mask_type: Any = AttnMaskType.padding,
        masked_softmax_fusion: bool = True,
        fp16: bool = False,
        bf16: bool = False,
    ) -> None:
        super().__init__()
        if layer_number < 1 or hidden_size % num_attention_heads:
            raise ConfigError(
                f"TransformerSelfAttentionRing needs layer_number >= 1 and hidden_size divisible by "
                f"num_attention_heads, got layer_number={layer_number}, {hidden_size} / {num_attention_heads}"
            )
        if fp16 and bf16:
            raise ConfigError("TransformerSelfAttentionRing: fp16 and bf16 cannot both be True")
        self.hidden_size, self.num_attention_heads, self.layer_number = hidden_size, num_attention_heads, layer_number
        self.hidden_size_per_attention_head = hidden_size // num_attention_heads
        self.attention_mask_func = attention_mask_func
        self.attn_mask_type = _mask_type(attn_mask_type)
        self.apply_query_key_layer_scaling = apply_query_key_layer_scaling
        self.convert_fp16_to_fp32_in_softmax = convert_fp16_to_fp32_in_softmax or apply_query_key_layer_scaling
        self.half_scores = fp16 or bf16
        self.coeff = layer_number if apply_query_key_layer_scaling else None
        self.norm_factor = math.sqrt(hidden_size) * (self.coeff or 1)
        self.world_size = _sharding().split.size
        self.query_key_value = _Linear(hidden_size, 3 * hidden_size)
        self.attention_dropout = nn.Dropout(attention_dropout)
        self.dense = _Linear(hidden_size, hidden_size, bias=True, skip_bias_add=True)

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Args:
            hidden_states: ``[sub_seq_len, batch, hidden]``, this rank's slice.
            attention_mask: ``[batch, 1, sub_seq_len, seq_len]`` for ``attention_mask_func``, or None.

        Returns:
            ``(output, bias)``: the output ``[sub_seq_len, batch, hidden]`` without the dense
            layer's bias, and that bias.
        """
        sub_seq, batch, _ = hidden_states.size()
        heads, head_size = self.num_attention_heads, self.hidden_size_per_attention_head
        mixed = self.query_key_value(hidden_states).view(sub_seq, batch, heads, 3 * head_size)
        query, key, value = torch.split(mixed, head_size, dim=-1)

        def per_head(t: torch.Tensor) -> torch.Tensor:  # [s, b, n, d] -> [b * n, s, d]
            return t.reshape(sub_seq, batch * heads, head_size).transpose(0, 1).contiguous()

        scores = RingQK.apply(per_head(query), per_head(key), batch, heads, sub_seq) / self.norm_factor
        probs = self._softmax(scores.view(batch, heads, sub_seq, -1), attention_mask)
        probs = self.attention_dropout(probs).view(batch * heads, sub_seq, -1)
        context = RingAV.apply(probs, per_head(value), batch, heads, head_size, sub_seq)
        context = context.view(batch, heads, sub_seq, head_size).permute(2, 0, 1, 3).reshape(sub_seq, batch, -1)
        output, bias = self.dense(context)
        return output, bias

    def _softmax(self, scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        dtype = scores.dtype
        if self.half_scores and self.convert_fp16_to_fp32_in_softmax:
            scores = scores.float()
        if self.coeff is not None:
            scores = scores * self.coeff
        if mask is not None:
            scores = self.attention_mask_func(scores, mask)
        elif self.attn_mask_type is AttnMaskType.causal:
            split = _sharding().split
            rows = split.positions(scores.size(-2), scores.device)
            later = torch.arange(scores.size(-1), device=scores.device) > rows.unsqueeze(-1)
            scores = scores.masked_fill(later, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return probs.to(dtype) if self.half_scores and self.convert_fp16_to_fp32_in_softmax else probs

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, num_attention_heads={self.num_attention_heads}, "
            f"layer_number={self.layer_number}, attn_mask_type={self.attn_mask_type.name}, "
            f"apply_query_key_layer_scaling={self.apply_query_key_layer_scaling}, world_size={self.world_size}"
        )


def _mask_type(value: Any) -> AttnMaskType:
    """Colossal-AI's enum member, ours, its name or its value."""
    for kind in AttnMaskType:
        if value in (kind, kind.name, kind.value) or getattr(value, "name", None) == kind.name:
            return kind
    raise ConfigError(f"attn_mask_type must be AttnMaskType.padding or AttnMaskType.causal, got {value!r}")
