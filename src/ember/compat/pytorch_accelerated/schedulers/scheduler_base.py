"""pytorch-accelerated's scheduler base classes: schedulers of any optimizer field, stepped per update.

:class:`SchedulerBase` is told the number of updates (``step_update(num_updates)``);
:class:`StatefulSchedulerBase` counts them itself (``step()``, as torch's schedulers), so the
Trainer steps it after each applied optimizer update. A subclass implements
``get_updated_values(num_updates)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import torch

from ember.errors import EngineError

__all__ = ["SchedulerBase", "StatefulSchedulerBase"]


class SchedulerBase(ABC):
    """Schedules ``param_group_field`` (``"lr"`` by default) of every parameter group of ``optimizer``.

    Each group's starting value is kept in the group as ``initial_<field>`` (an existing one is
    kept, so a scheduler built again over the same optimizer starts from the same values) and in
    :attr:`base_lr_values`.

    Args:
        optimizer: the optimizer whose groups are updated.
        param_group_field: the group entry to schedule (``"lr"``, ``"weight_decay"``...).

    Raises:
        KeyError: a parameter group has no ``param_group_field`` (as pytorch-accelerated).

    Example:
        >>> class Halve(SchedulerBase):
        ...     def get_updated_values(self, num_updates):
        ...         return [v / 2 ** (num_updates // 100) for v in self.base_lr_values]
        >>> scheduler = Halve(optimizer); scheduler.step_update(250)
    """

    def __init__(self, optimizer: torch.optim.Optimizer, param_group_field: str = "lr") -> None:
        self.optimizer = optimizer
        self.param_group_field = param_group_field
        self._initial_param_group_field = f"initial_{param_group_field}"
        for i, group in enumerate(optimizer.param_groups):
            if param_group_field not in group:
                raise KeyError(f"{param_group_field} missing from param_groups[{i}]")
            group.setdefault(self._initial_param_group_field, group[param_group_field])
        self.base_lr_values: list[Any] = [g[self._initial_param_group_field] for g in optimizer.param_groups]
        self._update_param_groups(self.base_lr_values)

    @abstractmethod
    def get_updated_values(self, num_updates: int) -> Any:
        """The field's values after ``num_updates`` updates: one for every group, one per group
        (a list or tuple), or None to leave the groups as they are."""

    def step_update(self, num_updates: int) -> None:
        """Set the field to its values for ``num_updates`` updates."""
        values = self.get_updated_values(num_updates)
        if values is not None:
            self._update_param_groups(values)

    def _update_param_groups(self, values: Any) -> None:
        groups = self.optimizer.param_groups
        if not isinstance(values, (list, tuple)):
            values = [values] * len(groups)
        elif len(values) != len(groups):
            raise EngineError(
                f"{type(self).__name__}.get_updated_values returned {len(values)} values for "
                f"{len(groups)} parameter groups: return one value, or one per group"
            )
        for group, value in zip(groups, values, strict=True):
            group[self.param_group_field] = value

    def state_dict(self) -> dict[str, Any]:
        """Every attribute but the optimizer (saved on its own)."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Set the attributes :meth:`state_dict` returned."""
        self.__dict__.update({k: v for k, v in state_dict.items() if k != "optimizer"})


class StatefulSchedulerBase(SchedulerBase, ABC):
    """A :class:`SchedulerBase` that counts its updates: ``step()`` after each optimizer update.

    The count starts at -1, so the first ``step()`` sets the values for 0 updates (the
    schedule's first value). Subclasses define :meth:`state_dict`/:meth:`load_state_dict`.

    Example:
        >>> for batch in loader:
        ...     loss_func(model(batch[0]), batch[1]).backward(); optimizer.step(); scheduler.step()
    """

    def __init__(self, optimizer: torch.optim.Optimizer, param_group_field: str = "lr") -> None:
        super().__init__(optimizer=optimizer, param_group_field=param_group_field)
        self._num_updates = -1

    def step(self) -> None:
        """Count one more update and set the field's values for it."""
        self._num_updates += 1
        self.step_update(self._num_updates)

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state (its update count included)."""

    @abstractmethod
    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
