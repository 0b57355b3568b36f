"""What ``fit`` checks and builds before the loop starts: arguments, dataloaders, the run plan."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ember.errors import TrainerError

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from ember.logging import DistributedLogger
    from ember.trainer.trainer import Trainer

REQUIRED_KEYS = ("loss", "output", "label", "batch_size")
_REQUIRED = frozenset(REQUIRED_KEYS)


@dataclass
class Run:
    """One ``fit`` call: its dataloaders, limits and where it started (epoch and step)."""

    train_dataloader: Any
    test_dataloader: Any
    epochs: int | None
    max_steps: int | None
    test_interval: int
    start_epoch: int
    start_step: int
    return_output_label: bool
    resume: Any = None
    replicas: int = 1
    """The Engine's data-parallel replicas: every batch adds ``batch_size * replicas`` samples seen."""

    def steps_done(self, t: Trainer) -> bool:
        """True once ``max_steps`` optimizer updates were made in this fit."""
        return self.max_steps is not None and t.cur_step - self.start_step >= self.max_steps

    def done(self, t: Trainer) -> bool:
        """True when no epoch is left to start."""
        epochs_done = self.epochs is not None and t.cur_epoch - self.start_epoch >= self.epochs
        return epochs_done or self.steps_done(t)

    def test_due(self, t: Trainer) -> bool:
        """True when the epoch ending now gets a test pass: every ``test_interval``, and the last."""
        if self.test_dataloader is None:
            return False
        nth = t.cur_epoch - self.start_epoch + 1
        last = (self.epochs is not None and nth >= self.epochs) or self.steps_done(t)
        return last or nth % self.test_interval == 0


def _positive_int(name: str, value: Any, optional: bool = True) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TrainerError(f"fit({name}=...) must be a positive int, got {value!r}")
    return value


def check_limits(epochs: Any, max_steps: Any, test_interval: Any) -> tuple[int | None, int | None, int]:
    """Validate ``epochs``/``max_steps``/``test_interval`` (at least one limit is needed)."""
    e, s = _positive_int("epochs", epochs), _positive_int("max_steps", max_steps)
    if e is None and s is None:
        raise TrainerError("fit needs epochs=N, max_steps=N or both (training stops at whichever comes first)")
    interval = _positive_int("test_interval", test_interval, optional=False)
    assert interval is not None
    return e, s, interval


def pick_loader(
    kind: str, loader: Any, dataset: Any, batch_size: int | None, shuffle: bool, kwargs: Mapping[str, Any] | None
) -> Any:
    """The dataloader given, or one built with ``ember.get_dataloader`` from the dataset given."""
    if loader is not None and dataset is not None:
        raise TrainerError(f"give {kind}_dataloader or {kind}_dataset, not both")
    if dataset is None:
        return loader
    if batch_size is None:
        raise TrainerError(f"fit({kind}_dataset=...) needs batch_size=N (samples per batch on each rank)")
    from ember.data import get_dataloader

    return get_dataloader(dataset, shuffle=shuffle, batch_size=batch_size, **dict(kwargs or {}))


def batches_per_epoch(loader: Any) -> int | None:
    """Batches in a full epoch on this rank (a pending mid-epoch start does not shorten it)."""
    sampler = getattr(loader, "sampler", None)
    bs = getattr(loader, "batch_size", None)
    if getattr(loader, "batch_sampler", None) is not None and bs and hasattr(sampler, "num_samples"):
        n = int(sampler.num_samples)  # type: ignore[union-attr]
        return n // bs if loader.drop_last else math.ceil(n / bs)
    try:
        return len(loader)
    except TypeError:
        return None


def real_num_samples(loader: Any) -> int | None:
    """How many of this rank's evaluation samples are not the sampler's padding repeats."""
    sampler = getattr(loader, "sampler", None)
    if hasattr(sampler, "real_num_samples"):
        return int(sampler.real_num_samples)  # type: ignore[union-attr]
    if type(sampler).__name__ == "DistributedSampler":
        if sampler.drop_last:  # type: ignore[union-attr]
            return int(sampler.num_samples)  # type: ignore[union-attr]
        return len(range(sampler.rank, len(sampler.dataset), sampler.num_replicas))  # type: ignore[union-attr]
    return None


def check_test_loader(loader: Any, world: int) -> None:
    """Under ``world`` data-parallel ranks an evaluation loader must shard the data, or samples count twice."""
    if loader is None or world == 1:
        return
    replicas = getattr(getattr(loader, "sampler", None), "num_replicas", None)
    if replicas != world:
        raise TrainerError(
            f"the test dataloader is not split across the {world} ranks (its sampler is "
            f"{type(getattr(loader, 'sampler', None)).__name__}), so every sample would be counted {world} "
            "times: build it with ember.get_dataloader(...) or pass it through ember.initialize"
        )


def warn_if_unsharded(loader: Any, world: int, logger: DistributedLogger) -> None:
    """Under ``world`` data-parallel ranks, say so when every rank would train on all the data."""
    if world > 1 and getattr(getattr(loader, "sampler", None), "num_replicas", world) != world:
        logger.warning(
            f"the training dataloader is not split across the {world} ranks: each rank trains on all of it. "
            "Build it with ember.get_dataloader(...) or pass it through ember.initialize to shard it",
            ranks=[0],
        )


def epoch_batches(loader: DataLoader[Any], epoch: int, consumed: int, logger: DistributedLogger) -> Iterable[Any]:
    """Prepare ``loader`` for ``epoch`` and skip the ``consumed`` batches of a resumed epoch."""
    sampler = getattr(loader, "sampler", None)
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)  # type: ignore[union-attr]
    if consumed == 0:
        return loader
    if hasattr(sampler, "start_at") and loader.batch_size is not None:
        # A state saved after an epoch's last batch (before its end) may point past a short tail.
        position = consumed * loader.batch_size
        sampler.start_at(min(position, getattr(sampler, "num_samples", position)))  # type: ignore[union-attr]
        # iter(DataLoader) draws a seed from torch's CPU generator; the interrupted run drew it at
        # the epoch's start, before the state being resumed was saved: do not draw it twice.
        cpu_rng = torch.get_rng_state()
        iterator = iter(loader)
        torch.set_rng_state(cpu_rng)
        return iterator
    logger.warning(
        f"resuming epoch {epoch} after {consumed} batches by reading and dropping them: this loader's "
        "sampler cannot start mid-epoch (build it with ember.get_dataloader to skip without reading)",
        ranks=[0],
    )
    return itertools.islice(loader, consumed, None)


def check_result(result: Any, where: str) -> None:
    """A step's result must be a dict with loss, output, label and batch_size."""
    if type(result) is dict and result.keys() >= _REQUIRED:  # the common case, without an ABC check
        return
    if not isinstance(result, Mapping):
        raise TrainerError(f"{where} must return a dict with {', '.join(REQUIRED_KEYS)}; got {type(result).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in result]
    if missing:
        raise TrainerError(f"{where} returned a dict without {missing}: it needs {', '.join(REQUIRED_KEYS)}")
