"""Stand-ins for what the pytorch-accelerated examples take from torchvision, timm and disk.

``make_image_folder`` writes a small two-class image dataset as one ``.pt`` tensor per image in
``root/<split>/<class>/`` (the layout ``torchvision.datasets.ImageFolder`` reads); the class is
which half of the image is brighter, so a small CNN learns it at any image size.
:class:`ImageFolder` reads that layout and resizes to the transform's size; :func:`resnet18`
and :func:`create_model` return a small CNN with a ``fc`` head that works at any size.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

CLASSES = ("left", "right")


def make_image_folder(root: str | Path, n_train: int = 64, n_val: int = 32, size: int = 24, seed: int = 0) -> Path:
    """Write ``root/train`` and ``root/val`` (idempotent); return ``root``."""
    root = Path(root)
    g = torch.Generator().manual_seed(seed)
    for split, n in (("train", n_train), ("val", n_val)):
        for c, name in enumerate(CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n // len(CLASSES)):
                image = torch.rand(3, size, size, generator=g) * 0.5
                half = slice(0, size // 2) if c == 0 else slice(size // 2, size)
                image[:, :, half] += 0.5
                torch.save(image, folder / f"{i:04d}.pt")
    return root


def resize(size: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """A transform resizing a (C, H, W) image to ``size`` x ``size``."""

    def transform(image: torch.Tensor) -> torch.Tensor:
        return nn.functional.interpolate(image[None], size=(size, size), mode="bilinear", align_corners=False)[0]

    return transform


class ImageFolder(torch.utils.data.Dataset[Any]):
    """``torchvision.datasets.ImageFolder`` for the ``.pt`` images of :func:`make_image_folder`."""

    def __init__(self, root: str | Path, transform: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        root = Path(root)
        self.classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.samples = [(f, i) for i, c in enumerate(self.classes) for f in sorted((root / c).glob("*.pt"))]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        image = torch.load(path, weights_only=True)
        return (self.transform(image) if self.transform else image), label


class SmallCNN(nn.Module):
    """Two convolutions, global average pooling and a linear head called ``fc`` (as a ResNet's)."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU()
        )
        self.fc = nn.Linear(16 * 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 2))  # left and right halves
        return self.fc(pooled.flatten(1))


def resnet18(pretrained: bool = False, num_classes: int = 1000) -> SmallCNN:
    """``torchvision.models.resnet18``'s stand-in."""
    return SmallCNN(num_classes)


def create_model(name: str, pretrained: bool = False, num_classes: int = 1000) -> SmallCNN:
    """``timm.create_model``'s stand-in."""
    return SmallCNN(num_classes)
