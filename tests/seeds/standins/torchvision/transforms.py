"""The torchvision transforms the example programs use."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch


class ToTensor:
    """An ``(H, W)`` or ``(H, W, C)`` uint8 array -> a ``(C, H, W)`` float tensor in [0, 1]."""

    def __call__(self, image: Any) -> torch.Tensor:
        if isinstance(image, torch.Tensor):
            return image
        array = np.asarray(image)
        tensor = torch.from_numpy(array.copy()).float() / 255.0
        return tensor.unsqueeze(0) if tensor.dim() == 2 else tensor.permute(2, 0, 1)


class Normalize:
    """``(x - mean) / std`` per channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean, self.std = torch.as_tensor(mean).reshape(-1, 1, 1), torch.as_tensor(std).reshape(-1, 1, 1)

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


def _image(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else ToTensor()(x)


class RandomCrop:
    """Pad by ``padding`` (and up to ``size`` with ``pad_if_needed``), crop ``size`` x ``size`` at a random place."""

    def __init__(self, size: int, padding: int | None = None, pad_if_needed: bool = False) -> None:
        self.size, self.padding, self.pad_if_needed = size, padding or 0, pad_if_needed

    def __call__(self, image: Any) -> torch.Tensor:
        x = torch.nn.functional.pad(_image(image), [self.padding] * 4)
        if self.pad_if_needed:  # torchvision pads both sides of a short edge up to the size
            short = [max(0, self.size - d) for d in x.shape[-2:]]
            x = torch.nn.functional.pad(x, [short[1], short[1], short[0], short[0]])
        top, left = (int(torch.randint(0, d - self.size + 1, ())) for d in x.shape[-2:])
        return x[..., top : top + self.size, left : left + self.size]


class RandomHorizontalFlip:
    """Flip left-right with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, image: Any) -> torch.Tensor:
        x = _image(image)
        return x.flip(-1) if float(torch.rand(())) < self.p else x


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


class Resize:
    """Resize the shorter side to ``size``, or to ``(h, w)`` (bilinear)."""

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = size

    def __call__(self, image: Any) -> torch.Tensor:
        x = _image(image)
        h, w = x.shape[-2:]
        if isinstance(self.size, int):
            scale = self.size / min(h, w)
            out_size = (round(h * scale), round(w * scale))
        else:
            out_size = _pair(self.size)
        return torch.nn.functional.interpolate(x[None], size=out_size, mode="bilinear")[0]


class CenterCrop:
    """The central ``size`` x ``size`` (or ``(h, w)``) part."""

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _pair(size)

    def __call__(self, image: Any) -> torch.Tensor:
        x = _image(image)
        (h, w), (th, tw) = x.shape[-2:], self.size
        top, left = (h - th) // 2, (w - tw) // 2
        return x[..., top : top + th, left : left + tw]


class RandomResizedCrop:
    """A random crop of ``scale`` (30-100%) of the area, resized to ``size`` x ``size`` (or ``(h, w)``)."""

    def __init__(self, size: int | Sequence[int], scale: tuple[float, float] = (0.3, 1.0)) -> None:
        self.size, self.scale = _pair(size), scale

    def __call__(self, image: Any) -> torch.Tensor:
        x = _image(image)
        h, w = x.shape[-2:]
        low, high = self.scale
        side = max(1, int(min(h, w) * (low + (high - low) * float(torch.rand(()))) ** 0.5))
        top, left = int(torch.randint(0, h - side + 1, ())), int(torch.randint(0, w - side + 1, ()))
        crop = x[..., top : top + side, left : left + side]
        return torch.nn.functional.interpolate(crop[None], size=self.size, mode="bilinear")[0]


class AutoAugmentPolicy:
    """The policies' names."""

    IMAGENET = "imagenet"
    CIFAR10 = "cifar10"
    SVHN = "svhn"


class AutoAugment:
    """A random horizontal flip in place of the learnt policy: the stand-in images (a bright
    stripe per class on noise) have nothing a colour or shear policy would teach."""

    def __init__(self, policy: str = AutoAugmentPolicy.IMAGENET) -> None:
        self.policy, self.flip = policy, RandomHorizontalFlip()

    def __call__(self, image: Any) -> torch.Tensor:
        return self.flip(image)
