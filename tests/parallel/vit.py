"""A tiny ViT written once against a :class:`~ember.parallel.layers.LayerSet`: built from torch's
modules it is the one-process reference, built from a grid's layers it is the 2-D, 2.5-D or
3-D model, with the same parameter names and whole shapes.

Its forward is its children in order (``embed``, ``blocks.0`` …, ``norm``, ``pool``, ``head``),
so pipeline parallelism can split it. The attention has one fused qkv projection whose output
features are ``[heads, 3 · head_dim]`` (Colossal-AI's ViT layout): any block of whole heads is
a block of features, so the local heads of every mode come from the tensors' shapes.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from ember.parallel.layers import LayerSet


class Attention(nn.Module):
    def __init__(self, L: LayerSet, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.qkv, self.proj = L.Linear(dim, 3 * dim), L.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, -1, 3 * self.head_dim).transpose(1, 2).chunk(3, dim=-1)
        y = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, L: LayerSet, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.attn = L.LayerNorm(dim), Attention(L, dim, heads)
        self.ln2, self.fc1, self.act = L.LayerNorm(dim), L.Linear(dim, 2 * dim), nn.GELU()
        self.fc2 = L.Linear(2 * dim, dim)
        self.drop = L.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.drop(self.fc2(self.act(self.fc1(self.ln2(x)))))


class ClsToken(nn.Module):
    """The class token's features: ``x[:, 0]``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 0]


class ViT(nn.Module):
    """Images ``[batch, 2, 4, 4]`` in 2×2 patches (4 patches + the class token), ``dim`` features,
    ``depth`` blocks, ``classes`` logits."""

    def __init__(self, L: LayerSet, dim: int = 8, heads: int = 2, depth: int = 2, classes: int = 4) -> None:
        super().__init__()
        self.embed = L.PatchEmbedding(4, 2, 2, dim, position_embed_initializer=_small)
        self.blocks = nn.ModuleList(Block(L, dim, heads) for _ in range(depth))
        self.norm, self.pool, self.head = L.LayerNorm(dim), ClsToken(), L.Classifier(dim, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embed(images)
        for block in self.blocks:
            x = block(x)
        return self.head(self.pool(self.norm(x)))


def _small(tensor: torch.Tensor, fan_in: int, fan_out: int) -> None:
    nn.init.normal_(tensor, std=0.02)


def images(n: int, seed: int = 3) -> TensorDataset:
    """``n`` images ``[2, 4, 4]`` with labels 0-3 from their quadrants' means."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, 4, 4, generator=g)
    label = (x[:, :, :2].mean(dim=(1, 2, 3)) > 0).long() * 2 + (x[:, :, :, :2].mean(dim=(1, 2, 3)) > 0).long()
    return TensorDataset(x, label)
