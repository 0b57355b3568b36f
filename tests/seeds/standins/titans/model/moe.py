"""``titans.model.moe.ViTMoE``: Titans' PR-MoE vision transformer, small, on Colossal-AI's MoE layers.

As Titans builds it: a patch embedding, ``depth`` pre-norm blocks whose odd ones have a
``MoeModule`` of ``build_ffn_experts`` (top-1 with a residual expert when ``use_residual``, else
top-2), the mean token into a zero-initialised classifier, and the blocks' auxiliary losses
handed to ``MOE_CONTEXT.add_loss`` for ``MoeLoss``. Attention is torch's multi-head attention
(Titans has its own module of the same arithmetic). ``Widenet`` is imported by the example and
not used: building one says it has no stand-in.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ember.compat.colossalai.context import MOE_CONTEXT
from ember.compat.colossalai.nn.layer.moe import MoeModule, build_ffn_experts


class MLPForMoe(nn.Module):
    """Titans' expert MLP: linear, GELU, linear, dropout."""

    def __init__(self, d_model: int, d_ff: int, drop_rate: float = 0.0) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model), nn.Dropout(drop_rate))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class _Block(nn.Module):
    def __init__(self, hidden: int, heads: int, d_ff: int, drop: float, moe: MoeModule | None) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(hidden, eps=1e-6), nn.LayerNorm(hidden, eps=1e-6)
        self.att = nn.MultiheadAttention(hidden, heads, dropout=drop, batch_first=True)
        self.ffn = moe or MLPForMoe(hidden, d_ff, drop)

    def forward(self, x: torch.Tensor, aux: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor | float]:
        h = self.norm1(x)
        x = x + self.att(h, h, h, need_weights=False)[0]
        out = self.ffn(self.norm2(x))
        if isinstance(out, tuple):  # a MoeModule: (output, l_aux)
            out, l_aux = out
            aux = aux + l_aux
        return x + out, aux


class ViTMoE(nn.Module):
    """A vision transformer with MoE feed-forward layers in every other block (Titans' arguments)."""

    def __init__(self, num_experts: int | list[int], use_residual: bool = False, capacity_factor_train: float = 1.25,
                 capacity_factor_eval: float = 2.0, drop_tks: bool = True, img_size: int = 224, patch_size: int = 16,
                 in_chans: int = 3, num_classes: int = 1000, depth: int = 12, hidden_size: int = 768,
                 num_heads: int = 12, d_kv: int = 64, d_ff: int = 3072, attention_drop: float = 0.0,
                 drop_rate: float = 0.1, drop_path: float = 0.0, checkpoint: bool = False) -> None:  # fmt: skip
        super().__init__()
        experts = num_experts if isinstance(num_experts, list) else [num_experts] * (depth // 2)
        self.embedding = nn.Conv2d(in_chans, hidden_size, patch_size, stride=patch_size)
        self.pos = nn.Parameter(torch.zeros(1, (img_size // patch_size) ** 2, hidden_size))
        blocks = []
        for i in range(depth):
            moe = None
            if i % 2:
                n = experts[i // 2]
                moe = MoeModule(dim_model=hidden_size, num_experts=n, top_k=1 if use_residual else 2,
                                capacity_factor_train=capacity_factor_train,
                                capacity_factor_eval=capacity_factor_eval,
                                noisy_policy="Jitter" if use_residual else "Gaussian", drop_tks=drop_tks,
                                use_residual=use_residual, expert_cls=MLPForMoe,
                                expert_instance=build_ffn_experts(n, hidden_size, d_ff, drop_rate=drop_rate),
                                d_model=hidden_size, d_ff=d_ff, drop_rate=drop_rate)  # fmt: skip
            blocks.append(_Block(hidden_size, num_heads, d_ff, drop_rate, moe))
        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(hidden_size, eps=1e-6)
        self.linear = nn.Linear(hidden_size, num_classes)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        MOE_CONTEXT.reset_loss()
        x = self.embedding(x).flatten(2).transpose(1, 2) + self.pos
        aux: torch.Tensor | float = 0.0
        for block in self.blocks:
            x, aux = block(x, aux)
        MOE_CONTEXT.add_loss(aux)
        return self.linear(self.norm(x).mean(dim=1))


class Widenet(nn.Module):
    """Titans' WideNet: no stand-in here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("titans.model.moe.Widenet has no stand-in in tests/seeds/standins")
