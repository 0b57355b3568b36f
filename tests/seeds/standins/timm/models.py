"""``timm.models.vit_base_patch16_224`` as a small patch model of the same interface (224 x 224 in)."""

from __future__ import annotations

import torch
from torch import nn


class _SmallPatchModel(nn.Module):
    def __init__(self, num_classes: int, drop_rate: float) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 16, kernel_size=16, stride=16)  # 14 x 14 patches, as ViT-B/16
        self.drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.patch(x).flatten(2).mean(-1)))


def vit_base_patch16_224(pretrained: bool = False, num_classes: int = 1000, drop_rate: float = 0.0,
                         **kwargs: object) -> nn.Module:  # fmt: skip
    """A small patch model standing in for ViT-B/16."""
    return _SmallPatchModel(num_classes, drop_rate)
