"""What ``fit`` checks and builds before the loop starts: arguments, dataloaders, the run plan."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ember.errors import TrainerError
from ember.logging import get_dist_logger

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from ember.logging import DistributedLogger
    from ember.trainer._state import State

__all__ = ["FitPlan", "check_limits", "check_test_loader", "epoch_batches", "pick_loader", "real_num_samples",
           "warn_if_unsharded"]  # fmt: skip


@dataclass
class FitPlan:
    """One ``fit`` call: its dataloaders, limits and where it started (epoch and step).

    (Not a tracked run, :class:`ember.track.Run`.)
    """

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

    def steps_done(self, counters: State) -> bool:
        """True once ``max_steps`` optimizer updates were made in this fit."""
        return self.max_steps is not None and counters.step - self.start_step >= self.max_steps

    def done(self, counters: State) -> bool:
        """True when no epoch is left to start."""
        epochs_done = self.epochs is not None and counters.epoch - self.start_epoch >= self.epochs
        return epochs_done or self.steps_done(counters)

    def test_due(self, counters: State) -> bool:
        """True when the epoch ending now gets a test pass: every ``test_interval``, and the last."""
        if self.test_dataloader is None:
            return False
        nth = counters.epoch - self.start_epoch + 1
        last = (self.epochs is not None and nth >= self.epochs) or self.steps_done(counters)
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


def check_test_loader(loader: Any, world: int, logger: DistributedLogger | None = None) -> None:
    """Under ``world`` data-parallel ranks, a test loader is sharded across them or read whole by each.

    Each rank evaluates what it is given, and the metric hooks average ``[sum, count]`` over
    ranks, so both give the mean over the whole set. Whole on every rank by choice
    (:func:`ember.data.keep_unsharded`, ``get_dataloader(add_sampler=False)``) is accepted
    silently; a DataLoader that is whole on every rank without that mark gets a one-line warning
    (once per loader): the numbers are right, but each rank does the whole pass, which is most
    often an oversight. A sampler split over another number of ranks would count some samples and
    miss others: that is an error.
    """
    if loader is None or world == 1:
        return
    from ember.data import is_kept_unsharded

    sampler = getattr(loader, "sampler", None)
    replicas = getattr(sampler, "num_replicas", 1)
    if replicas == world or is_kept_unsharded(loader) or sampler is None:
        return  # sharded; whole by choice; or not a DataLoader (the user shards it)
    if replicas != 1:
        raise TrainerError(
            f"the test dataloader's sampler {type(sampler).__name__} splits the data across {replicas} ranks, "
            f"but the Engine has {world} data-parallel ranks: the ranks together would see "
            f"{'only part' if replicas > world else 'some samples more than once'} of it. Build it with "
            "ember.get_dataloader(...) (sharded) or get_dataloader(..., add_sampler=False) (whole on every rank)"
        )
    if loader not in _WARNED:
        _WARNED.add(loader)
        (logger or get_dist_logger()).warning(
            f"the test dataloader is not split across the {world} ranks: each rank evaluates all of it (the "
            "metrics stay right). Build it with ember.get_dataloader(...) to shard it, or with "
            "add_sampler=False / ember.data.keep_unsharded(loader) to say this is intended",
            ranks=[0],
        )


_WARNED: weakref.WeakSet[Any] = weakref.WeakSet()
"""Test loaders already warned about (evaluate may be called with one many times)."""


def warn_if_unsharded(loader: Any, world: int, logger: DistributedLogger) -> None:
    """Under ``world`` data-parallel ranks, say so when every rank would train on all the data
    (unless the loader is whole by choice: :func:`ember.data.keep_unsharded`)."""
    from ember.data import is_kept_unsharded

    if world > 1 and getattr(getattr(loader, "sampler", None), "num_replicas", world) != world:
        if is_kept_unsharded(loader):
            return
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
