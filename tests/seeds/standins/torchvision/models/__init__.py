"""torchvision's ResNets: ResNet-18/34 as a small CNN of the same interface (``num_classes``, a ``fc``
head), ResNet-50 as :mod:`.resnet`'s narrow ResNet with torchvision's layer names."""

from __future__ import annotations

import torch
from torch import nn

from .resnet import resnet50

__all__ = ["ResNet18_Weights", "resnet18", "resnet34", "resnet50"]


class _SmallResNet(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(4), nn.Flatten())  # fmt: skip
        self.fc = nn.Linear(8 * 16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if min(x.shape[-2:]) > 32:  # an ImageNet-sized input is averaged down to 32 x 32 first: a test's seconds
            x = nn.functional.adaptive_avg_pool2d(x, 32)
        return self.fc(self.features(x))


class ResNet18_Weights:
    """The names of torchvision's ResNet-18 weights; the stand-in has no weights to load."""

    IMAGENET1K_V1 = "IMAGENET1K_V1"
    DEFAULT = IMAGENET1K_V1


def resnet18(num_classes: int = 1000, **kwargs: object) -> nn.Module:
    """A small CNN standing in for ResNet-18."""
    return _SmallResNet(num_classes)


def resnet34(num_classes: int = 1000, **kwargs: object) -> nn.Module:
    """A small CNN standing in for ResNet-34."""
    return _SmallResNet(num_classes)
