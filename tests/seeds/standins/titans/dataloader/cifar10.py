"""``titans.dataloader.cifar10.build_cifar``: CIFAR-10 train and test loaders through ``get_dataloader``.

As Titans builds them (random crop, resize for the test split, CIFAR-10's normalisation, the
training loader shuffled), from the torchvision stand-in's CIFAR-10; Titans' AutoAugment policy
is left out (the stand-in images are made up, there is nothing to augment for).
"""

from __future__ import annotations

from typing import Any

from ember.compat.colossalai.utils import get_dataloader
from tests.seeds.standins.torchvision import transforms
from tests.seeds.standins.torchvision.datasets import CIFAR10

_NORMALIZE = transforms.Normalize((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))


def build_cifar(batch_size: int, root: str, padding: int | None = None, pad_if_needed: bool = False,
                crop: int = 224, resize: int = 224) -> tuple[Any, Any]:  # fmt: skip
    """The training and test loaders of CIFAR-10 under ``root``, images ``crop``/``resize`` pixels wide."""
    train = transforms.Compose([transforms.RandomCrop(crop, padding=padding, pad_if_needed=pad_if_needed),
                                transforms.ToTensor(), _NORMALIZE])  # fmt: skip
    test = transforms.Compose([transforms.Resize(resize), transforms.ToTensor(), _NORMALIZE])
    train_dataset = CIFAR10(root=root, train=True, download=True, transform=train)
    test_dataset = CIFAR10(root=root, train=False, transform=test)
    train_dataloader = get_dataloader(dataset=train_dataset, shuffle=True, batch_size=batch_size, pin_memory=True)
    test_dataloader = get_dataloader(dataset=test_dataset, batch_size=batch_size, pin_memory=True)
    return train_dataloader, test_dataloader
