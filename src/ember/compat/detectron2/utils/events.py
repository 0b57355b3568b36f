"""detectron2's and LiBai's ``utils.events``: the event storage and its writers, on ember's StepStorage.

An :class:`EventStorage` keeps its scalars in an ember
:class:`~ember.trainer.storage.StepStorage` (:attr:`EventStorage.scalars`), tagged with the
detectron2 iteration. During ``SimpleTrainer.train`` that StepStorage is also the ember
Trainer's ``trainer.storage``: what native ember hooks put there (``train/loss``,
``throughput/samples_per_s``) is in the EventStorage too, and the other way round. One store.

Example:
    >>> with EventStorage(start_iter=0) as storage:
    ...     get_event_storage().put_scalar("loss", 0.5)
    ...     storage.history("loss").latest()
    0.5
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import logging
import os
import statistics
import time
from collections.abc import Iterator
from typing import IO, Any

import torch

from ember import distributed
from ember.errors import TrainerError
from ember.trainer.storage import StepStorage, UnknownScalarError

__all__ = [
    "CommonMetricPrinter",
    "EventStorage",
    "EventWriter",
    "HistoryBuffer",
    "JSONWriter",
    "get_event_storage",
    "has_event_storage",
]

_OPEN: list[EventStorage] = []  # the storages entered with `with`, innermost last (detectron2's design)


def get_event_storage() -> EventStorage:
    """The innermost :class:`EventStorage` entered with ``with`` (``train()`` enters one).

    Raises:
        TrainerError: no EventStorage is open here.

    Example:
        >>> get_event_storage().put_scalar("grad_norm", norm)   # in a hook or run_step
    """
    if not _OPEN:
        raise TrainerError(
            "get_event_storage() found no open EventStorage: call it during trainer.train() (from a hook or "
            "run_step), or inside `with EventStorage(start_iter):`"
        )
    return _OPEN[-1]


def has_event_storage() -> bool:
    """Whether an :class:`EventStorage` is open (``get_event_storage()`` would return one)."""
    return bool(_OPEN)


class HistoryBuffer:
    """The values of one scalar in an :class:`EventStorage` (fvcore's ``HistoryBuffer`` methods).

    A view: it reads the storage when asked, so it always shows the newest values. Windows count
    values, newest last; :meth:`global_avg` covers every value ever put.

    Example:
        >>> storage.history("time").median(20), storage.history("time").global_avg()
    """

    def __init__(self, scalars: StepStorage, name: str) -> None:
        self._scalars, self.name = scalars, name

    def latest(self) -> float:
        """The newest value."""
        return self._scalars.latest(self.name)

    def median(self, window_size: int) -> float:
        """The median of the newest ``window_size`` values."""
        return statistics.median(self._recent(window_size))

    def avg(self, window_size: int) -> float:
        """The mean of the newest ``window_size`` values."""
        return statistics.fmean(self._recent(window_size))

    def global_avg(self) -> float:
        """The mean of every value put under this name."""
        return self._scalars.global_mean(self.name)

    def values(self) -> list[tuple[float, int]]:
        """The kept ``(value, iteration)`` pairs, oldest first."""
        return [(v, it) for it, v in self._scalars.values(self.name)]

    def _recent(self, window_size: int) -> list[float]:
        if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
            raise TrainerError(f"history({self.name!r}): window_size must be a positive int, got {window_size!r}")
        return [v for _, v in self._scalars.values(self.name)[-window_size:]]


class EventStorage:
    """Scalars put during training, tagged with the iteration: detectron2's ``EventStorage``.

    Enter it with ``with`` to make it :func:`get_event_storage`'s answer (``train()`` does that
    with a new storage each call). Values may be tensors: they are kept as they are and read
    only when a writer asks, so putting a loss every iteration costs no host-device sync.

    Args:
        start_iter: the iteration number new values are tagged with at first.
        window: how many recent values to keep per name (``global_avg`` still covers all).

    Attributes:
        scalars: the ember StepStorage holding the values (``SimpleTrainer.train`` makes it
            the ember Trainer's ``trainer.storage``).
        samples: samples consumed so far, for LiBai's printers (0 unless a trainer sets it).

    Example:
        >>> with EventStorage(0) as storage:
        ...     storage.put_scalars(loss=0.9, lr=0.1, smoothing_hint=False)
        ...     storage.latest()
        {'loss': (0.9, 0), 'lr': (0.1, 0)}
    """

    def __init__(self, start_iter: int = 0, *, window: int = 1000) -> None:
        self.scalars = StepStorage(window, totals=True)
        self._iter = _as_iteration(start_iter, "EventStorage(start_iter=...)")
        self._hints: dict[str, bool] = {}
        self._prefix = ""
        self.samples = 0

    # -- putting ----------------------------------------------------------------------------
    def put_scalar(self, name: str, value: Any, smoothing_hint: bool = True, cur_iter: int | None = None) -> None:
        """Record ``value`` under ``name`` (inside :meth:`name_scope`, prefixed) at this iteration.

        Args:
            name: the scalar's name.
            value: a number (anything ``float()`` takes) or a one-element tensor (kept lazily).
            smoothing_hint: whether writers should smooth it (a median over recent values);
                every put of one name must give the same hint.
            cur_iter: the iteration to tag it with instead of :attr:`iter`.

        Raises:
            TrainerError: a value that is not a number, or a hint that changed.
        """
        name = self._prefix + name
        if not isinstance(value, torch.Tensor):
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise TrainerError(f"scalar {name!r} must be a number or a one-element tensor, got {value!r}") from None
        hint = self._hints.setdefault(name, bool(smoothing_hint))
        if hint != bool(smoothing_hint):
            raise TrainerError(
                f"scalar {name!r} was put with smoothing_hint={hint} before and {bool(smoothing_hint)} now: "
                "give one name one hint"
            )
        step = self._iter if cur_iter is None else _as_iteration(cur_iter, f"put_scalar({name!r}, cur_iter=...)")
        self.scalars.put_scalar(name, value, step=step)

    def put_scalars(self, *, smoothing_hint: bool = True, cur_iter: int | None = None, **kwargs: Any) -> None:
        """Record several scalars: ``storage.put_scalars(loss=loss, accuracy=acc)``."""
        for name, value in kwargs.items():
            self.put_scalar(name, value, smoothing_hint=smoothing_hint, cur_iter=cur_iter)

    @contextlib.contextmanager
    def name_scope(self, name: str) -> Iterator[None]:
        """Prefix the names put inside the block with ``name/``."""
        before, self._prefix = self._prefix, name.rstrip("/") + "/"
        try:
            yield
        finally:
            self._prefix = before

    # -- reading ----------------------------------------------------------------------------
    def history(self, name: str) -> HistoryBuffer:
        """The values of ``name``.

        Raises:
            UnknownScalarError: nothing was put under ``name`` (a ``KeyError`` too, as in detectron2).
        """
        if name not in self.scalars:
            known = ", ".join(self.scalars.names()) or "none yet"
            raise UnknownScalarError(f"no scalar {name!r} was put in the EventStorage (known: {known})")
        return HistoryBuffer(self.scalars, name)

    def histories(self) -> dict[str, HistoryBuffer]:
        """``{name: HistoryBuffer}`` for every scalar put so far."""
        return {name: HistoryBuffer(self.scalars, name) for name in self.scalars.names()}

    def latest(self) -> dict[str, tuple[float, int]]:
        """``{name: (newest value, its iteration)}`` for every scalar (one device sync in all)."""
        values = self.scalars.latest_all()
        return {name: (value, self.scalars.latest_step(name)) for name, value in values.items()}

    def latest_with_smoothing_hint(self, window_size: int = 20) -> dict[str, tuple[float, int]]:
        """Like :meth:`latest`, but scalars hinted for smoothing give the median of their values
        from the last ``window_size`` iterations."""
        out = self.latest()
        for name, (_, iteration) in out.items():
            if self._hints.get(name, True):
                out[name] = (self.history(name).median(self.count_samples(name, window_size)), iteration)
        return out

    def count_samples(self, name: str, window_size: int = 20) -> int:
        """How many values of ``name`` were put in the last ``window_size`` iterations."""
        newest_first = [it for _, it in reversed(self.history(name).values())]
        return sum(1 for _ in itertools.takewhile(lambda it: it > newest_first[0] - window_size, newest_first))

    def smoothing_hints(self) -> dict[str, bool]:
        """``{name: smoothing_hint}`` (True for names put through ember's own API)."""
        return {name: self._hints.get(name, True) for name in self.scalars.names()}

    # -- the iteration ----------------------------------------------------------------------
    @property
    def iter(self) -> int:
        """The iteration new values are tagged with; during ``train()`` always ``trainer.iter``."""
        return self._iter

    @iter.setter
    def iter(self, value: int) -> None:
        self._iter = _as_iteration(value, "storage.iter")

    @property
    def iteration(self) -> int:
        """Another name for :attr:`iter`."""
        return self._iter

    def step(self) -> None:
        """Advance :attr:`iter` by one (for loops that do not set it themselves)."""
        self._iter += 1

    def __enter__(self) -> EventStorage:
        _OPEN.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if not _OPEN or _OPEN[-1] is not self:
            raise TrainerError("EventStorage blocks must close in the reverse order they were entered")
        _OPEN.pop()


def _as_iteration(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TrainerError(f"{where} must be an int iteration number, got {value!r}")
    return int(value)


class EventWriter:
    """What :class:`~ember.compat.detectron2.engine.hooks.PeriodicWriter` calls: ``write()`` and ``close()``."""

    def write(self) -> None:
        """Write what the open :class:`EventStorage` holds."""
        raise NotImplementedError

    def close(self) -> None:
        """Release files and handles (nothing by default)."""


class JSONWriter(EventWriter):
    """Append the scalars to a file, one JSON object per iteration: ``{"iteration": 19, "loss": ...}``.

    Each write adds the iterations not written yet, with the scalars hinted for smoothing as the
    median of their last ``window_size`` iterations.

    Args:
        json_file: the file (appended to if it exists).
        window_size: the smoothing window, in iterations.
    """

    def __init__(self, json_file: str | os.PathLike[str], window_size: int = 20) -> None:
        self._file: IO[str] = open(json_file, "a")  # noqa: SIM115 - closed by close()
        self._window = window_size
        self._written = -1  # the last iteration written

    def write(self) -> None:
        """Append the iterations that have new scalars since the last write."""
        rows: dict[int, dict[str, Any]] = {}
        for name, (value, iteration) in get_event_storage().latest_with_smoothing_hint(self._window).items():
            if iteration > self._written:
                rows.setdefault(iteration, {})[name] = value
        for iteration in sorted(rows):
            self._file.write(json.dumps({**rows[iteration], "iteration": iteration}, sort_keys=True) + "\n")
        if rows:
            self._written = max(rows)
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the file."""
        self._file.close()


class CommonMetricPrinter(EventWriter):
    """Log the usual training line on rank 0: ETA, iteration, losses, times, learning rate, memory.

    ``eta: 0:01:02  iter: 219  total_loss: 0.41  loss_cls: 0.3  time: 0.0507  last_time: 0.0491
    data_time: 0.0012  last_data_time: 0.0010  lr: 0.02  max_mem: 812M`` — losses (names with
    ``loss``) and ``[metric]`` names as the median of their last ``window_size`` iterations, time
    as the mean since the timer's warm-up; nothing after a finished run.

    The lines go to :attr:`logger`, this module's logger (``ember.compat.detectron2.utils.events``,
    as detectron2 logs on ``detectron2.utils.events``): under ember's ``"ember"`` logger, so
    they reach the console ember's logging writes to, and under ``ember.compat.detectron2``,
    the logger ``utils.logger.setup_logger()`` sets up.

    Args:
        max_iter: the iteration training ends at, for the ETA (None: no ETA).
        window_size: the smoothing window, in iterations.
    """

    def __init__(self, max_iter: int | None = None, window_size: int = 20) -> None:
        self._max_iter, self._window = max_iter, window_size
        self._last: tuple[int, float] | None = None  # (iteration, time) of the last line, for a rough ETA
        self.logger = logging.getLogger(__name__)

    def write(self) -> None:
        """Log one line for the open storage's iteration."""
        storage = get_event_storage()
        iteration = storage.iter
        if iteration == self._max_iter:  # the run is over: the line would only repeat the last one
            return
        eta = self._eta(storage)
        parts = [f"eta: {eta}"] if eta else []
        parts.append(f"iter: {iteration}")
        for name, buffer in storage.histories().items():
            if "loss" in name or "[metric]" in name:
                parts.append(f"{name}: {buffer.median(storage.count_samples(name, self._window)):.4g}")
        scalars = storage.scalars
        if "time" in scalars:
            parts += [f"time: {scalars.global_mean('time'):.4f}", f"last_time: {scalars.latest('time'):.4f}"]
        if "data_time" in scalars:
            window = storage.count_samples("data_time", self._window)
            parts += [f"data_time: {storage.history('data_time').avg(window):.4f}",
                      f"last_data_time: {scalars.latest('data_time'):.4f}"]  # fmt: skip
        parts.append(f"lr: {scalars.latest('lr'):.5g}" if "lr" in scalars else "lr: N/A")
        if torch.cuda.is_available():
            parts.append(f"max_mem: {torch.cuda.max_memory_allocated() / 2**20:.0f}M")
        if distributed.rank() == 0:
            self.logger.info("  ".join(parts))

    def _eta(self, storage: EventStorage) -> str:
        if self._max_iter is None:
            return ""
        left = self._max_iter - storage.iter - 1
        if "time" in storage.scalars:
            seconds = storage.history("time").median(1000) * left
            storage.put_scalar("eta_seconds", seconds, smoothing_hint=False)
            return str(datetime.timedelta(seconds=int(seconds)))
        now, last, self._last = time.perf_counter(), self._last, (storage.iter, time.perf_counter())
        if last is None or storage.iter == last[0]:
            return ""
        return str(datetime.timedelta(seconds=int((now - last[1]) / (storage.iter - last[0]) * left)))
