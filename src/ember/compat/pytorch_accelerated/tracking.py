"""pytorch-accelerated's ``tracking`` module: the run history the Trainer and callbacks share.

The Trainer records ``train_loss_epoch`` and ``eval_loss_epoch`` (``evaluation_loss`` in a
standalone ``evaluate``) here from ember's own :class:`~ember.trainer.hooks.LossHook`, once per
epoch; callbacks record and read their own metrics by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from ember.errors import TrainerError

__all__ = ["InMemoryRunHistory", "LossTracker", "RunHistory"]


class RunHistory(ABC):
    """What a pytorch-accelerated Trainer's ``run_history`` offers; subclass it to store elsewhere."""

    @abstractmethod
    def get_metric_names(self) -> Iterable[str]:
        """The names of every metric recorded so far."""

    @abstractmethod
    def get_metric_values(self, metric_name: str) -> Iterable[Any]:
        """Every value recorded for ``metric_name``, oldest first."""

    @abstractmethod
    def get_latest_metric(self, metric_name: str) -> Any:
        """The last value recorded for ``metric_name``."""

    @abstractmethod
    def update_metric(self, metric_name: str, metric_value: Any) -> None:
        """Record ``metric_value`` for ``metric_name`` (under the current name prefix)."""

    @abstractmethod
    def set_metric_name_prefix(self, prefix: str = "") -> None:
        """Put ``prefix`` before the names of the metrics recorded from now on."""

    @property
    @abstractmethod
    def metric_name_prefix(self) -> str:
        """The prefix :meth:`update_metric` puts before names."""

    @abstractmethod
    def delete_metric(self, metric_name: str) -> None:
        """Forget every value of ``metric_name``."""

    @property
    @abstractmethod
    def current_epoch(self) -> int:
        """The epoch in progress, counted from 1."""

    @abstractmethod
    def _increment_epoch(self) -> None:
        """Move to the next epoch (the Trainer calls it after each epoch's evaluation)."""

    @abstractmethod
    def _set_epoch(self, epoch: int) -> None:
        """Make ``epoch`` the current one (a resumed run)."""

    @abstractmethod
    def reset(self) -> None:
        """Forget every metric and go back to epoch 1."""


def increment_epoch(history: RunHistory) -> None:
    """Move ``history`` to the next epoch: its ``_increment_epoch``, pytorch-accelerated's name for it."""
    history._increment_epoch()


def set_epoch(history: RunHistory, epoch: int) -> None:
    """Make ``epoch`` ``history``'s current one (a resumed run): its ``_set_epoch``."""
    history._set_epoch(epoch)


class InMemoryRunHistory(RunHistory):
    """A :class:`RunHistory` kept in memory: a list of values per metric name.

    Example:
        >>> history = InMemoryRunHistory()
        >>> history.update_metric("accuracy", 0.91)
        >>> history.get_latest_metric("accuracy"), history.current_epoch
        (0.91, 1)
    """

    def __init__(self) -> None:
        self._current_epoch = 1
        self._metrics: defaultdict[str, list[Any]] = defaultdict(list)
        self._prefix = ""

    def get_metric_names(self) -> set[str]:
        """The names of every metric recorded so far."""
        return set(self._metrics)

    def get_metric_values(self, metric_name: str) -> list[Any]:
        """Every value recorded for ``metric_name`` (an empty list for an unknown name)."""
        return self._metrics[metric_name]

    def get_latest_metric(self, metric_name: str) -> Any:
        """The last value recorded for ``metric_name``.

        Raises:
            TrainerError: (a ``ValueError``, as pytorch-accelerated raises) nothing was recorded
                under that name; the message lists what was.
        """
        values = self._metrics.get(metric_name)
        if not values:
            known = ", ".join(sorted(k for k, v in self._metrics.items() if v)) or "none yet"
            raise TrainerError(f"no value was recorded for the metric {metric_name!r} (recorded: {known})")
        return values[-1]

    def update_metric(self, metric_name: str, metric_value: Any) -> None:
        """Append ``metric_value`` to the values of ``metric_name`` (after the name prefix)."""
        self._metrics[f"{self._prefix}{metric_name}"].append(metric_value)

    def set_metric_name_prefix(self, prefix: str = "") -> None:
        """Put ``prefix`` before the names of the metrics recorded from now on."""
        self._prefix = prefix

    @property
    def metric_name_prefix(self) -> str:
        """The prefix :meth:`update_metric` puts before names."""
        return self._prefix

    def delete_metric(self, metric_name: str) -> None:
        """Forget every value of ``metric_name`` (nothing happens for an unknown name)."""
        self._metrics.pop(metric_name, None)

    @property
    def current_epoch(self) -> int:
        """The epoch in progress, counted from 1."""
        return self._current_epoch

    def _increment_epoch(self) -> None:
        self._current_epoch += 1

    def _set_epoch(self, epoch: int) -> None:
        self._current_epoch = epoch

    def reset(self) -> None:
        """Forget every metric and go back to epoch 1."""
        self._current_epoch = 1
        self._metrics = defaultdict(list)

    def state_dict(self) -> dict[str, Any]:
        """The epoch and the metrics, for ember's checkpoints."""
        return {"current_epoch": self._current_epoch, "metrics": {k: list(v) for k, v in self._metrics.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self._current_epoch = int(state["current_epoch"])
        self._metrics = defaultdict(list, {k: list(v) for k, v in state["metrics"].items()})


class LossTracker:
    """A running, sample-weighted mean of batch losses (for callbacks that keep their own).

    Example:
        >>> tracker = LossTracker()
        >>> tracker.update(0.5, batch_size=4); tracker.update(1.0, batch_size=4)
        >>> tracker.average
        0.75
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start a new mean."""
        self.loss_value: float = 0.0
        self.total_loss: float = 0.0
        self.running_count: int = 0
        self._average: float = 0.0

    def update(self, loss_batch_value: float, batch_size: int = 1) -> None:
        """Add one batch's mean loss, weighted by its ``batch_size``."""
        self.loss_value = loss_batch_value
        self.total_loss += loss_batch_value * batch_size
        self.running_count += batch_size
        self._average = self.total_loss / self.running_count

    @property
    def average(self) -> float:
        """The mean so far (0 before the first update)."""
        return self._average
