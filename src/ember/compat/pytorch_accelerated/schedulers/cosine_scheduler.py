"""pytorch-accelerated's ``CosineLrScheduler``: linear warm-up, cosine annealing (k-decay), cool-down."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ember.errors import EngineError
from ember.trainer import Placeholders

from .scheduler_base import StatefulSchedulerBase

__all__ = ["CosineLrScheduler"]

_STATE = ("total_iterations", "lr_min_ratio", "lr_min", "warmup_iterations", "warmup_lr_init",
          "warmup_lr_ratio", "k_decay", "num_cooldown_iterations")  # fmt: skip


class CosineLrScheduler(StatefulSchedulerBase):
    """Cosine annealing without restarts, stepped after every optimizer update.

    The rates are pytorch-accelerated's, update for update: during the warm-up the rate rises in
    equal steps from ``warmup_starting_lr`` (or ``warmup_starting_lr_ratio`` × the group's rate);
    then it follows ``lr_min + (lr_max - lr_min) * (1 + cos(pi * t**k / T**k)) / 2`` over the
    ``T`` updates left after the warm-up and the cool-down (counted from the end of the warm-up);
    then it stays at the minimum (``lr_min``, or ``min_lr_ratio`` × the group's rate), also past
    the end of the schedule.

    Args:
        optimizer: the optimizer.
        total_num_epochs: epochs in the schedule, warm-up and cool-down included.
        num_update_steps_per_epoch: optimizer updates per epoch.
        k_decay: the k of k-decay; above 1 keeps the rate high for longer.
        lr_min: the lowest rate, for every group.
        min_lr_ratio: the lowest rate as a fraction of each group's rate (wins over ``lr_min``).
        num_warmup_epochs: epochs of linear warm-up.
        warmup_starting_lr: the first rate of the warm-up.
        warmup_starting_lr_ratio: that rate as a fraction of each group's rate (wins over
            ``warmup_starting_lr`` for the start; the slope is pytorch-accelerated's, from
            ``warmup_starting_lr``).
        num_cooldown_epochs: epochs held at the lowest rate at the end.

    Raises:
        EngineError: ``total_num_epochs`` or ``num_update_steps_per_epoch`` not >= 1, or ``lr_min`` < 0.

    Example:
        >>> trainer.train(train_dataset=ds, num_epochs=10, per_device_batch_size=32,
        ...               create_scheduler_fn=CosineLrScheduler.create_scheduler_fn(num_warmup_epochs=1))
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        total_num_epochs: int,
        num_update_steps_per_epoch: int,
        k_decay: float = 1.0,
        lr_min: float = 1e-6,
        min_lr_ratio: float | None = None,
        num_warmup_epochs: int = 0,
        warmup_starting_lr: float = 1e-6,
        warmup_starting_lr_ratio: float | None = None,
        num_cooldown_epochs: int = 0,
    ) -> None:
        super().__init__(optimizer)
        for name, value in (("total_num_epochs", total_num_epochs),
                            ("num_update_steps_per_epoch", num_update_steps_per_epoch)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise EngineError(f"CosineLrScheduler: {name} must be an int >= 1, got {value!r}")
        if not lr_min >= 0:
            raise EngineError(f"CosineLrScheduler: lr_min must be >= 0, got {lr_min!r}")
        self.total_iterations = total_num_epochs * num_update_steps_per_epoch
        self.lr_min_ratio, self.lr_min = min_lr_ratio, lr_min
        self.warmup_iterations = num_warmup_epochs * num_update_steps_per_epoch
        self.warmup_lr_init, self.warmup_lr_ratio = warmup_starting_lr, warmup_starting_lr_ratio
        self.k_decay = k_decay
        self.num_cooldown_iterations = num_cooldown_epochs * num_update_steps_per_epoch
        if self.warmup_iterations:
            self._update_param_groups(self.warmup_lr_init)

    def _floor(self, lr_max: float) -> float:
        return self.lr_min_ratio * lr_max if self.lr_min_ratio is not None else self.lr_min

    def get_updated_values(self, num_updates: int) -> Any:
        """Each group's rate after ``num_updates`` updates."""
        warmup, cooldown = self.warmup_iterations, self.num_cooldown_iterations
        cosine_iterations = self.total_iterations - (warmup + cooldown)
        if num_updates < warmup:
            start = self.warmup_lr_init
            return [
                (self.warmup_lr_ratio * lr if self.warmup_lr_ratio is not None else start)
                + num_updates * ((lr - start) / warmup)
                for lr in self.base_lr_values
            ]
        if num_updates < cosine_iterations:
            t, k = num_updates - warmup, self.k_decay
            return [
                self._floor(lr_max) + 0.5 * (lr_max - self._floor(lr_max))
                * (1 + math.cos(math.pi * t**k / cosine_iterations**k))
                for lr_max in self.base_lr_values
            ]  # fmt: skip
        return [self._floor(lr) for lr in self.base_lr_values]

    @classmethod
    def create_scheduler_fn(
        cls,
        total_num_epochs: Any = Placeholders.NUM_EPOCHS,
        num_update_steps_per_epoch: Any = Placeholders.NUM_UPDATE_STEPS_PER_EPOCH,
        k_decay: float = 1.0,
        lr_min: float = 1e-6,
        min_lr_ratio: float | None = None,
        num_warmup_epochs: int = 0,
        warmup_starting_lr: float = 1e-6,
        warmup_starting_lr_ratio: float | None = None,
        num_cooldown_epochs: int = 0,
    ) -> Callable[[torch.optim.Optimizer], CosineLrScheduler]:
        """A ``create_scheduler_fn`` for ``Trainer.train``: the epochs and updates per epoch
        default to the run's (placeholders the Trainer fills in); the other arguments as above.

        Returns:
            A ``functools.partial`` that builds the scheduler from the optimizer.
        """
        return functools.partial(
            cls, total_num_epochs=total_num_epochs, num_update_steps_per_epoch=num_update_steps_per_epoch,
            lr_min=lr_min, min_lr_ratio=min_lr_ratio, k_decay=k_decay, num_warmup_epochs=num_warmup_epochs,
            warmup_starting_lr=warmup_starting_lr, warmup_starting_lr_ratio=warmup_starting_lr_ratio,
            num_cooldown_epochs=num_cooldown_epochs,
        )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """The schedule's numbers and the update count (``num_updates``)."""
        return {**{k: getattr(self, k) for k in _STATE}, "num_updates": self._num_updates}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        for key in _STATE:
            setattr(self, key, state_dict[key])
        self._num_updates = state_dict["num_updates"]
