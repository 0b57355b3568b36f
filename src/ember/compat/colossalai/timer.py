"""Colossal-AI's ``Timer`` and ``MultiTimer`` (``colossalai.utils``): wall-clock timers with a history.

Times are ``time.perf_counter`` seconds, taken after ``torch.cuda.synchronize()`` when CUDA is
in use, so a stop counts the GPU work queued before it. The compat ``Trainer(timer=...)``
times its epochs and steps through a :class:`MultiTimer` (``Train-epoch``, ``Train-step``,
``Test-epoch``, ``Test-step``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from ember.errors import TrainerError

__all__ = ["MultiTimer", "Timer"]


def _now() -> float:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


class Timer:
    """Measures spans of time: ``start()``, then ``stop(keep_in_history=True)`` returns the span
    (seconds) and keeps it for :meth:`get_history_mean`/:meth:`get_history_sum`.

    Example:
        >>> timer = Timer(); timer.start(); train_one_epoch(); seconds = timer.stop(keep_in_history=True)
    """

    def __init__(self) -> None:
        self._started = False
        self._start_time = _now()
        self._elapsed = 0.0
        self._history: list[float] = []

    @property
    def has_history(self) -> bool:
        """Whether a span was kept."""
        return bool(self._history)

    @property
    def current_time(self) -> float:
        """The clock now (seconds)."""
        return _now()

    def start(self) -> None:
        """Start a span (a running one restarts)."""
        self._elapsed = 0.0
        self._start_time = _now()
        self._started = True

    def lap(self) -> float:
        """Seconds since :meth:`start`, the timer running on."""
        return _now() - self._start_time if self._started else self._elapsed

    def stop(self, keep_in_history: bool = False) -> float:
        """End the span; returns its seconds (and keeps them with ``keep_in_history``).

        Raises:
            TrainerError: the timer was not started.
        """
        if not self._started:
            raise TrainerError("Timer.stop() without start()")
        self._elapsed = _now() - self._start_time
        self._started = False
        if keep_in_history:
            self._history.append(self._elapsed)
        return self._elapsed

    def get_history_mean(self) -> float:
        """The mean of the kept spans.

        Raises:
            TrainerError: no span was kept.
        """
        if not self._history:
            raise TrainerError("Timer.get_history_mean(): no span was kept (stop(keep_in_history=True))")
        return sum(self._history) / len(self._history)

    def get_history_sum(self) -> float:
        """The sum of the kept spans (0 when none)."""
        return sum(self._history)

    def get_elapsed_time(self) -> float:
        """The last span's seconds (0 before the first stop)."""
        return self._elapsed

    def reset(self) -> None:
        """Forget the history and the last span; stop."""
        self._started, self._elapsed, self._history = False, 0.0, []


class MultiTimer:
    """Named :class:`Timer` s: ``start(name)``, ``stop(name, keep_in_history)``, ``get_timer(name)``.

    Args:
        on: whether the timers run (``set_status(False)`` turns them into no-ops).

    Example:
        >>> timer = MultiTimer()
        >>> trainer = Trainer(engine=engine, timer=timer, logger=logger)
        >>> trainer.fit(...); timer.get_timer("Train-epoch").get_history_mean()
    """

    def __init__(self, on: bool = True) -> None:
        self._on = on
        self._timers: dict[str, Timer] = {}

    def start(self, name: str) -> None:
        """Start timer ``name`` (created at first use)."""
        if self._on:
            self._timers.setdefault(name, Timer()).start()

    def stop(self, name: str, keep_in_history: bool) -> float | None:
        """Stop timer ``name``; returns its span (None while off).

        Raises:
            TrainerError: there is no timer of that name.
        """
        if not self._on:
            return None
        return self.get_timer(name).stop(keep_in_history)

    def get_timer(self, name: str) -> Timer:
        """The timer ``name``.

        Raises:
            TrainerError: there is none (the error lists those there are).
        """
        if name not in self._timers:
            raise TrainerError(f"MultiTimer has no timer {name!r} (it has {sorted(self._timers)})")
        return self._timers[name]

    def reset(self, name: str | None = None) -> None:
        """Reset timer ``name``, or every timer."""
        if self._on:
            for timer in [self.get_timer(name)] if name is not None else self._timers.values():
                timer.reset()

    def is_on(self) -> bool:
        """Whether the timers run."""
        return self._on

    def set_status(self, mode: bool) -> None:
        """Turn the timers on or off."""
        self._on = bool(mode)

    def __iter__(self) -> Iterator[tuple[str, Timer]]:
        return iter(self._timers.items())
