"""The torchvision transforms the example programs use."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch


class ToTensor:
    """An ``(H, W)`` or ``(H, W, C)`` uint8 array -> a ``(C, H, W)`` float tensor in [0, 1]."""

    def __call__(self, image: Any) -> torch.Tensor:
        array = np.asarray(image)
        tensor = torch.from_numpy(array.copy()).float() / 255.0
        return tensor.unsqueeze(0) if tensor.dim() == 2 else tensor.permute(2, 0, 1)


class Normalize:
    """``(x - mean) / std`` per channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean, self.std = torch.tensor(mean)[:, None, None], torch.tensor(std)[:, None, None]

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        return (tensor - self.mean) / self.std


class Compose:
    """The transforms one after the other."""

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x
