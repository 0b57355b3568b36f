"""A tiny causal language model and its one-process reference, for the context-parallel and
activation-checkpointing tests (one process and their torchrun script).

The model numbers its tokens with :func:`ember.parallel.context_parallel.positions` (``arange``
outside context parallelism) and computes attention with SDPA, so the same model runs on one
process and with every sequence split over several; its blocks' Linears carry the names
``plans.gpt_block`` splits (``attn.q_proj``..., ``mlp.fc1``/``fc2``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from ember.parallel.context_parallel import positions
from tests.parallel.common import reference, sgd

VOCAB, DIM, HEADS, MAX_LEN = 16, 16, 2, 64


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.head_dim, self.causal = dim // heads, causal
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, -1, self.head_dim).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, dim: int, dropout: float) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.act(self.fc1(x))))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, causal: bool, dropout: float) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(dim), Attention(dim, heads, causal)
        self.ln2, self.mlp = nn.LayerNorm(dim), MLP(dim, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """Token + position embeddings, ``layers`` blocks, a LayerNorm and a vocabulary head:
    ``(batch, length)`` token ids -> ``(batch, VOCAB, length)`` logits (as cross-entropy takes them)."""

    def __init__(self, causal: bool = True, layers: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, DIM), nn.Embedding(MAX_LEN, DIM)
        self.blocks = nn.ModuleList(Block(DIM, HEADS, causal, dropout) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(positions(idx.size(1), idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x)).transpose(1, 2)


def tiny_lm(seed: int = 0, causal: bool = True, layers: int = 2, dropout: float = 0.0) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(causal, layers, dropout)


token_loss = nn.functional.cross_entropy
"""Cross-entropy over every token: logits ``(B, V, T)``, labels ``(B, T)``."""


def corpus(n: int, length: int, seed: int = 1) -> TensorDataset:
    """``n`` sequences of ``length`` token ids, each labelled with the next token (a noisy count)."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    ids = (start + torch.arange(length + 1)) % VOCAB
    noise = torch.rand(n, length + 1, generator=g) < 0.2
    ids = torch.where(noise, torch.randint(0, VOCAB, (n, length + 1), generator=g), ids)
    return TensorDataset(ids[:, :-1], ids[:, 1:])


def lm_reference(
    model: nn.Module, ds: TensorDataset, batch: int, steps: int, clip: float | None = None
) -> dict[str, Any]:
    """One process, plain PyTorch, SGD with momentum: ``steps`` updates on batches of ``batch``."""
    return reference(model, sgd, ds, batch, steps, clip)
