"""Dataloaders whose sampler splits data across ranks and can resume in the middle of an epoch.

:class:`ResumableSampler` is used for one process and for many alike. Each epoch's order is a
function of ``(seed, epoch)`` only, so a resumed job sees the same order, and
:meth:`ResumableSampler.start_at` skips the samples an interrupted epoch already consumed
without loading them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler, Sampler

from ember import distributed
from ember.errors import DataError


class ResumableSampler(Sampler[int]):
    """Split ``range(len(dataset))`` across ranks, reshuffled per epoch from ``(seed, epoch)``.

    Like :class:`torch.utils.data.DistributedSampler`, when the length does not divide by the
    number of ranks the list is padded by repeating its start (or cut, with ``drop_last``), so
    every rank sees the same number of samples; :attr:`real_num_samples` says how many of this
    rank's samples are not such repeats (the repeats are at the end of each rank's share).

    Under tensor (or pipeline) parallelism the ranks of one group must see the same batches, so
    the defaults are the *data-parallel* size and rank (``ember.context.data_parallel_size`` /
    ``data_parallel_rank``), which equal the world size and global rank without those.

    Args:
        dataset: anything with ``len()``.
        num_replicas: number of data-parallel replicas (default: see above).
        rank: this replica's index (default: see above).
        shuffle: reshuffle every epoch.
        seed: the shuffling seed; equal on every rank.
        drop_last: cut the tail instead of padding it.

    Example:
        >>> sampler = ResumableSampler(dataset, shuffle=True, seed=0)
        >>> sampler.set_epoch(3); sampler.start_at(640)   # resume epoch 3 after 640 samples
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        self.dataset_len = len(dataset)
        default_rank, default_replicas = data_parallel_rank_and_size()
        self.num_replicas = default_replicas if num_replicas is None else num_replicas
        self.rank = default_rank if rank is None else rank
        if not 0 <= self.rank < self.num_replicas:
            raise DataError(f"sampler rank {self.rank} is outside 0…{self.num_replicas - 1}")
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self._start = 0
        self.loader_generator = torch.Generator()
        """Give this to the DataLoader: its per-epoch draw (worker seeds) then depends on the epoch only."""
        self.loader_generator.manual_seed(self._loader_seed())
        if drop_last:
            self.num_samples = self.dataset_len // self.num_replicas
        else:
            self.num_samples = math.ceil(self.dataset_len / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    @property
    def real_num_samples(self) -> int:
        """How many of this rank's samples are distinct dataset items (not padding repeats)."""
        if self.drop_last:
            return self.num_samples
        return len(range(self.rank, self.dataset_len, self.num_replicas))

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order (and DataLoader worker seeds) the next iteration yields."""
        self.epoch = epoch
        self.loader_generator.manual_seed(self._loader_seed())

    def _loader_seed(self) -> int:
        # Distinct from the shuffling stream (seed + epoch) and from other ranks' loaders.
        return (self.seed * 1_000_003 + self.epoch * 7_919 + self.rank + 1) % 2**63

    def start_at(self, position: int) -> None:
        """Make the next iteration (only) skip the first ``position`` samples of this rank."""
        if not 0 <= position <= self.num_samples:
            raise DataError(f"sampler position {position} is outside 0…{self.num_samples} for this rank")
        self._start = position

    def indices(self) -> list[int]:
        """This rank's full index list for the current epoch (ignoring any start position)."""
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.dataset_len, generator=g).tolist()
        else:
            order = list(range(self.dataset_len))
        if self.drop_last:
            order = order[: self.total_size]
        elif self.total_size > len(order):
            pad = self.total_size - len(order)
            order += (order * math.ceil(pad / max(len(order), 1)))[:pad]
        return order[self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        start, self._start = self._start, 0
        return iter(self.indices()[start:])

    def __len__(self) -> int:
        return self.num_samples - self._start

    def state_dict(self) -> dict[str, Any]:
        """The epoch and the seed, for checkpoints (the position is the caller's to count)."""
        return {"epoch": self.epoch, "seed": self.seed, "num_replicas": self.num_replicas}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the epoch (and seed) saved by :meth:`state_dict`."""
        self.seed = int(state.get("seed", self.seed))
        self.set_epoch(int(state["epoch"]))


def get_dataloader(
    dataset: Dataset[Any],
    shuffle: bool = False,
    batch_size: int = 1,
    add_sampler: bool = True,
    num_workers: int = 0,
    pin_memory: bool = False,
    drop_last: bool = False,
    seed: int | None = None,
    **kwargs: Any,
) -> DataLoader[Any]:
    """Build a DataLoader that shards ``dataset`` across ranks and can resume mid-epoch.

    Args:
        dataset: a map-style dataset (has ``__len__`` and ``__getitem__``).
        shuffle: reshuffle every epoch (from ``seed`` and the epoch number).
        batch_size: samples per batch on each rank.
        add_sampler: use ember's :class:`ResumableSampler`, sharded across the data-parallel
            ranks. False keeps DataLoader's own sampler (or the ``sampler`` you pass) and marks
            the loader with :func:`keep_unsharded`: every rank reads all of it, and
            ``ember.initialize`` and the Trainer leave it so (each rank evaluates the whole
            test set; the metric hooks' means stay right).
        num_workers: worker processes for loading.
        pin_memory: pin host memory (for CUDA).
        drop_last: drop the last incomplete batch (and cut the data to a multiple of ranks).
        seed: shuffling seed; defaults to the launched seed (or 0).
        **kwargs: passed to :class:`torch.utils.data.DataLoader` (``collate_fn``...).

    Returns:
        The DataLoader; call ``loader.sampler.set_epoch(epoch)`` each epoch when shuffling
        (the Trainer does it for you).

    Example:
        >>> train_dl = ember.get_dataloader(train_ds, shuffle=True, batch_size=64)
    """
    if not isinstance(dataset, Sized) or not hasattr(dataset, "__getitem__"):
        raise DataError(
            f"get_dataloader needs a map-style dataset with __len__ and __getitem__, got "
            f"{type(dataset).__name__}; for an IterableDataset build a DataLoader yourself"
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise DataError(f"batch_size must be a positive int, got {batch_size!r}")
    if add_sampler and ("sampler" in kwargs or "batch_sampler" in kwargs):
        raise DataError("get_dataloader builds its own sampler: pass add_sampler=False to use yours")
    if not add_sampler:
        return keep_unsharded(DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers,
                                         pin_memory=pin_memory, drop_last=drop_last, **kwargs))  # fmt: skip
    sampler = ResumableSampler(dataset, shuffle=shuffle, seed=_default_seed(seed), drop_last=drop_last)
    kwargs.setdefault("generator", sampler.loader_generator)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                      pin_memory=pin_memory, drop_last=drop_last, **kwargs)  # fmt: skip


_KEEP_UNSHARDED = "_ember_keep_unsharded"


def keep_unsharded(loader: DataLoader[Any]) -> DataLoader[Any]:
    """Mark ``loader`` as read whole by every rank, by choice, and return it.

    ``ember.initialize`` then returns it as it is instead of sharding it across the
    data-parallel ranks, and ``Trainer.fit``/``evaluate`` take it as a test loader without a
    warning: each rank evaluates every sample it yields. The metric hooks average
    ``[sum, count]`` over ranks, so their means equal one process's on the whole set.
    ``get_dataloader(..., add_sampler=False)`` marks the loaders it builds.

    Args:
        loader: a DataLoader whose sampler does not split the data across ranks.

    Returns:
        ``loader`` itself.

    Raises:
        DataError: ``loader`` is not a DataLoader, or its sampler is split across ranks.

    Example:
        >>> test_dl = ember.data.keep_unsharded(DataLoader(test_ds, batch_size=256))
    """
    if not isinstance(loader, DataLoader):
        raise DataError(f"keep_unsharded takes a torch DataLoader, got {type(loader).__name__}")
    replicas = getattr(loader.sampler, "num_replicas", 1)
    if replicas != 1:
        raise DataError(
            f"keep_unsharded got a loader whose sampler {type(loader.sampler).__name__} splits the data across "
            f"{replicas} ranks: build it without a distributed sampler (get_dataloader(..., add_sampler=False))"
        )
    setattr(loader, _KEEP_UNSHARDED, True)
    return loader


def is_kept_unsharded(loader: Any) -> bool:
    """Whether ``loader`` was marked by :func:`keep_unsharded` (every rank reads all of it)."""
    return bool(getattr(loader, _KEEP_UNSHARDED, False))


def make_resumable(
    loader: DataLoader[Any], seed: int | None = None, *, num_replicas: int | None = None, rank: int | None = None
) -> DataLoader[Any]:
    """Return ``loader`` rebuilt with a :class:`ResumableSampler` (the same loader if it has one).

    Keeps batch size, workers, collate function, pinning and ``drop_last``; shuffles when the
    original used a random sampler. ``initialize`` calls this for loaders it is given, with the
    Engine's data-parallel ``num_replicas``/``rank``: a ResumableSampler that shards differently
    is rebuilt with the same shuffle, seed and ``drop_last``.
    """
    if num_replicas is None or rank is None:
        rank, num_replicas = data_parallel_rank_and_size()
    old = loader.sampler
    if isinstance(old, ResumableSampler):
        if (old.num_replicas, old.rank) == (num_replicas, rank):
            return loader
        sampler = ResumableSampler(loader.dataset, num_replicas, rank, old.shuffle, old.seed, old.drop_last)  # type: ignore[arg-type]
        sampler.set_epoch(old.epoch)
        return _with_sampler(loader, sampler)
    if loader.batch_size is None:
        raise DataError(
            "this DataLoader uses a custom batch_sampler, which ember cannot split across ranks: "
            "build it with ember.get_dataloader(...) or pass a per-rank loader yourself"
        )
    if not isinstance(loader.dataset, Sized):
        raise DataError("ember cannot shard an IterableDataset: shard it yourself by rank")
    shuffle = isinstance(loader.sampler, RandomSampler)
    if not shuffle and type(loader.sampler).__name__ not in ("SequentialSampler", "DistributedSampler"):
        raise DataError(
            f"this DataLoader's sampler {type(loader.sampler).__name__} cannot be split across ranks "
            "by ember: build the loader with ember.get_dataloader(...)"
        )
    if type(loader.sampler).__name__ == "DistributedSampler":
        shuffle = bool(getattr(loader.sampler, "shuffle", False))
    sampler = ResumableSampler(
        loader.dataset, num_replicas, rank, shuffle=shuffle, seed=_default_seed(seed), drop_last=loader.drop_last
    )
    return _with_sampler(loader, sampler)


def _with_sampler(loader: DataLoader[Any], sampler: ResumableSampler) -> DataLoader[Any]:
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        persistent_workers=loader.persistent_workers,
        prefetch_factor=loader.prefetch_factor if loader.num_workers > 0 else None,
        generator=sampler.loader_generator,
    )


def data_parallel_rank_and_size() -> tuple[int, int]:
    """``(rank, size)`` among data-parallel replicas: the launched context's, else the process group's."""
    from ember import context

    if context.is_launched():
        ctx = context.get_context()
        return ctx.data_parallel_rank, ctx.data_parallel_size
    return distributed.rank(), distributed.world_size()


def _default_seed(seed: int | None) -> int:
    if seed is not None:
        return seed
    from ember.context import get_context

    return get_context(default=True).seed


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor moved to ``device`` (pinned tensors copy asynchronously).

    Tensors may sit in (nested) tuples, lists, namedtuples and dicts; anything else is returned
    as it is. Tensors already on ``device`` are not copied.

    Example:
        >>> x, y = to_device((x, y), torch.device("cuda", 0))
    """
    if isinstance(batch, torch.Tensor):
        if batch.device == device:
            return batch
        return batch.to(device, non_blocking=batch.is_pinned())
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch
