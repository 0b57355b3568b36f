"""Stand-ins for what the Colossal-AI seed programs import from torchvision (not installed here).

``CIFAR10``: 32×32 RGB images are replaced by small 3×8×8 ones whose class (10 of them) is a
fixed random template plus noise, so a tiny network learns them in a few epochs; the train set
has 512 samples, the test set 202 (not a multiple of the per-rank batch, nor of 2 ranks).
``resnet34``: a small CNN with the same call signature. Neither downloads anything.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

_TEMPLATES = torch.randn(10, 3, 8, 8, generator=torch.Generator().manual_seed(0))


class CIFAR10(Dataset[tuple[torch.Tensor, int]]):
    """``CIFAR10(root, train=True, transform=None, download=False)``: synthetic, deterministic."""

    def __init__(self, root: Any = None, train: bool = True, transform: Any = None, download: bool = False) -> None:
        n = 512 if train else 202
        g = torch.Generator().manual_seed(1 if train else 2)
        self.targets = torch.randint(0, 10, (n,), generator=g)
        self.data = _TEMPLATES[self.targets] + 3.0 * torch.randn(n, 3, 8, 8, generator=g)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = self.data[i]
        return (self.transform(img) if self.transform else img), int(self.targets[i])


def resnet34(num_classes: int = 1000) -> nn.Module:
    """A small CNN standing in for torchvision's ``resnet34(num_classes=...)``."""
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 8 * 8, num_classes))
