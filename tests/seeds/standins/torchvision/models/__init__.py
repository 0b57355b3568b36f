"""torchvision's ResNets: ResNet-18/34 as a small CNN of the same interface (``num_classes``, a ``fc``
head), ResNet-50 as :mod:`.resnet`'s narrow ResNet with torchvision's layer names."""

from __future__ import annotations

import torch
from torch import nn

from .resnet import resnet50

__all__ = ["resnet18", "resnet34", "resnet50"]


class _SmallResNet(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(4), nn.Flatten())  # fmt: skip
        self.fc = nn.Linear(8 * 16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


def resnet18(num_classes: int = 1000, **kwargs: object) -> nn.Module:
    """A small CNN standing in for ResNet-18."""
    return _SmallResNet(num_classes)


def resnet34(num_classes: int = 1000, **kwargs: object) -> nn.Module:
    """A small CNN standing in for ResNet-34."""
    return _SmallResNet(num_classes)
