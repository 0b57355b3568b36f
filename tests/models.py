"""Tiny CPU models and data shared by the tests."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset


def tiny_mlp(seed: int = 0, dropout: float = 0.0) -> nn.Module:
    """A 8→16→4 MLP with fixed initial weights."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(8, 16), nn.Tanh()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(16, 4))
    return nn.Sequential(*layers)


def tiny_dataset(n: int = 256, seed: int = 1) -> TensorDataset:
    """``n`` random 8-feature inputs with labels 0-3 from a fixed rule (learnable)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] > 0).long() * 2 + (x[:, 1] > 0).long()
    return TensorDataset(x, y)


def params_of(model: nn.Module) -> list[torch.Tensor]:
    """Detached copies of the parameters, in order."""
    return [p.detach().clone() for p in model.parameters()]
