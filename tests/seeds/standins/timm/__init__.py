"""A stand-in for what the examples take from ``timm``: ``create_model`` for the ResNets they name."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

_IMAGENET = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225), "input_size": (3, 224, 224),
             "interpolation": "bicubic", "crop_pct": 0.875}  # fmt: skip


class _SmallTimmModel(nn.Module):
    """A small CNN with timm's ``get_classifier`` and ``default_cfg`` and a ``fc`` head (as timm's
    ResNets have); any input size is averaged down to 16 x 16 first, so that a test at 224 x 224
    takes moments."""

    default_cfg = _IMAGENET

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.stage = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.global_pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, num_classes)

    def get_classifier(self) -> nn.Module:
        return self.fc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(x, 16)
        return self.fc(self.global_pool(self.stage(self.stem(x))).flatten(1))


def create_model(model_name: str, pretrained: bool = False, num_classes: int = 1000, **kwargs: Any) -> nn.Module:
    """A small CNN for the ResNets the examples name (``resnet50d``, ``resnetrs50``); its weights
    are random (``pretrained`` has nothing to download here)."""
    if not model_name.startswith("resnet"):
        raise ValueError(f"the timm stand-in has ResNets only, not {model_name!r}")
    return _SmallTimmModel(num_classes)
