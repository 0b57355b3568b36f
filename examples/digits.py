"""The data and model the examples share: scikit-learn's bundled 8x8 digits (no download)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset


def digits_datasets(test_fraction: float = 0.2, size: int = 8) -> tuple[TensorDataset, TensorDataset]:
    """Train and test sets of 1x``size``x``size`` images in [0, 1] with labels 0-9."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    if size != 8:
        x = nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    n_test = int(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


class DigitsCNN(nn.Module):
    """Two convolutions and a linear head; works for any input size (adaptive pooling)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.1), nn.Linear(32 * 4 * 4, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
