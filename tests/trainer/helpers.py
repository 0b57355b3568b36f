"""Small builders shared by the Trainer tests: an Engine over a tiny MLP, loaders, a log recorder."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ember
from ember import distributed
from ember.engine import Engine
from tests.models import tiny_dataset, tiny_mlp


def make_engine(
    accumulation: int = 1, lr: float = 0.1, seed: int = 0, criterion: Any = "ce", dropout: float = 0.0, **config: Any
) -> Engine:
    """An Engine over ``tiny_mlp(seed, dropout)`` with SGD+momentum and cross-entropy."""
    model = tiny_mlp(seed, dropout)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss = nn.CrossEntropyLoss() if criterion == "ce" else criterion
    engine, *_ = ember.initialize(model, opt, loss, config={"gradient_accumulation": accumulation, **config})
    return engine


def loader(n: int = 64, batch_size: int = 8, shuffle: bool = False, seed: int = 1) -> DataLoader[Any]:
    """A resumable loader over ``tiny_dataset(n, seed)``."""
    return ember.get_dataloader(tiny_dataset(n, seed), shuffle=shuffle, batch_size=batch_size, seed=0)


def plain_loader(n: int = 64, batch_size: int = 8, seed: int = 1) -> DataLoader[Any]:
    """A plain torch DataLoader (sequential) over ``tiny_dataset(n, seed)``."""
    return DataLoader(tiny_dataset(n, seed), batch_size=batch_size)


def params(module: nn.Module) -> list[torch.Tensor]:
    """Detached copies of the parameters."""
    return [p.detach().clone() for p in module.parameters()]


def all_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Bit-identical tensor lists."""
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


class RecordingLogger:
    """Stands in for ember's DistributedLogger and keeps the messages."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str]] = []

    def _add(self, level: str, msg: str, ranks: Any) -> None:
        if ranks is None or distributed.rank() in ranks:  # as ember's logger: only the ranks asked for
            self.records.append((level, msg))

    def info(self, msg: str, *args: Any, ranks: Any = None) -> None:
        self._add("info", msg, ranks)

    def warning(self, msg: str, *args: Any, ranks: Any = None) -> None:
        self._add("warning", msg, ranks)

    def error(self, msg: str, *args: Any, ranks: Any = None) -> None:
        self._add("error", msg, ranks)

    def debug(self, msg: str, *args: Any, ranks: Any = None) -> None:
        self._add("debug", msg, ranks)

    def lines(self, contains: str = "") -> list[str]:
        """Messages containing ``contains``."""
        return [m for _, m in self.records if contains in m]


def labelled(x: torch.Tensor, y: torch.Tensor) -> TensorDataset:
    """A TensorDataset of ``(x, y)``."""
    return TensorDataset(x, y)
