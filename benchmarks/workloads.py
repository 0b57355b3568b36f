"""The models and data every contender shares: built from one seed, held in memory.

The data is a list of ready-made batches; the loader's "sample" is a whole batch and its
collate function unwraps it, so fetching a batch is one list index and the step-overhead
cases measure the training loops rather than per-sample collation (which would cost every
contender the same and hide the differences). Every contender uses this same loader.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

Batch = tuple[torch.Tensor, torch.Tensor]


class BatchDataset(Dataset[Batch]):
    """Item ``i`` is the whole ``i``-th batch ``(x, y)``."""

    def __init__(self, batches: list[Batch]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> Batch:
        return self.batches[i]


def make_batches(shape: tuple[int, ...], n_batches: int, batch_size: int, classes: int, seed: int) -> list[Batch]:
    """``n_batches`` random ``(x, y)`` batches, the same for a given seed."""
    g = torch.Generator().manual_seed(seed + 1)
    return [
        (torch.randn(batch_size, *shape, generator=g), torch.randint(0, classes, (batch_size,), generator=g))
        for _ in range(n_batches)
    ]


def tiny_mlp() -> nn.Module:
    """784 → 128 → 10: overhead-dominated."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))


def small_cnn() -> nn.Module:
    """Two conv blocks on 1×28×28 and a linear head: compute-dominated."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10),
    )  # fmt: skip


def linear() -> nn.Module:
    """One 8 → 10 linear layer on 8 features: a step that is nearly all framework overhead."""
    return nn.Sequential(nn.Flatten(), nn.Linear(8, 10))


def wide_mlp(hidden: int) -> nn.Module:
    """A large MLP for checkpoint sizes (parameters ≈ 2·hidden² + 784·hidden)."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10),
    )  # fmt: skip


def unwrap(items: list[Batch]) -> Batch:
    """Collate a one-item list of ready-made batches: the batch itself."""
    return items[0]


LOADER_KWARGS: dict[str, Any] = {"batch_size": 1, "shuffle": False, "collate_fn": unwrap}
"""How every contender's DataLoader is built (peers that build their own get these)."""

MODELS = {"mlp": tiny_mlp, "cnn": small_cnn, "linear": linear}
SHAPES = {"mlp": (1, 28, 28), "cnn": (1, 28, 28), "linear": (8,)}


class Workload:
    """Model, optimizer, loss and loader of one run, built from ``params``.

    ``params``: ``model`` (mlp/cnn), ``batches``, ``batch_size``, ``epochs``, ``seed``, ``lr``.
    """

    def __init__(self, params: Mapping[str, Any]) -> None:
        self.params = params
        seed = int(params.get("seed", 0))
        kind = str(params.get("model", "mlp"))
        self.batches = make_batches(SHAPES[kind], int(params["batches"]), int(params["batch_size"]), 10, seed)
        self.dataset = BatchDataset(self.batches)
        self.probe = self.batches[:4]  # kept when a rank takes its shard of the batches
        torch.manual_seed(seed)
        self.model = MODELS[kind]()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=float(params.get("lr", 0.01)), momentum=0.9)
        self.criterion = nn.CrossEntropyLoss()
        self.epochs = int(params["epochs"])

    def loader(self) -> DataLoader[Batch]:
        """The batches in order, one per step, no collation."""
        return DataLoader(self.dataset, **LOADER_KWARGS)

    @property
    def steps(self) -> int:
        """Optimizer steps in the run."""
        return self.epochs * len(self.batches)

    @torch.no_grad()
    def final_loss(self, model: nn.Module | None = None) -> float:
        """The trained model's mean loss over the first batches: proves the work done."""
        model = model if model is not None else self.model
        was = model.training
        model.eval()
        x = torch.cat([b[0] for b in self.probe])
        y = torch.cat([b[1] for b in self.probe])
        loss = float(self.criterion(model(x), y))
        model.train(was)
        return loss
