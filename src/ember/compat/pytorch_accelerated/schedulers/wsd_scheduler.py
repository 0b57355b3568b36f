"""pytorch-accelerated's ``WSDLrScheduler``: warm-up, a stable rate, a quick decay before each checkpoint.

The Warmup-Stable-Decay schedule (Wen et al., "Understanding Warmup-Stable-Decay Learning
Rates", 2024), with pytorch-accelerated's numbers update for update: checkpoints at
``total_steps`` (one) or on a geometric progression from a quarter of it (``total // 4 * 2**i``);
in each period between checkpoints the rate stays at the groups' rates until
``decay_phase_ratio`` of the period is left, then decays to ``lr_min`` × the rate
(``1 - sqrt(t)`` shaped, or ``1 / (t (1/lr_min - 1) + 1)``). A run continued from a pre-decay
checkpoint (``is_continuation_from_checkpoint=True``, then ``load_state_dict``) starts a new
stable phase over its own ``total_steps``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ember.errors import ConfigError
from ember.trainer import Placeholders

from .scheduler_base import StatefulSchedulerBase

__all__ = ["WSDConfigError", "WSDLrScheduler", "estimate_checkpoint_steps"]


class WSDConfigError(ConfigError, AssertionError):
    """A WSD setting out of range (an ``AssertionError`` too, as pytorch-accelerated raises)."""


def estimate_checkpoint_steps(total_steps: int, num_checkpoints: int = 3) -> list[int]:
    """Checkpoint steps on a geometric progression: ``[total]`` for one, else ``total // 4 * 2**i``
    up to ``total`` (the paper's 50B -> 100B -> 200B tokens)."""
    if num_checkpoints == 1:
        return [total_steps]
    steps: list[int] = []
    for i in range(num_checkpoints):
        steps.append(min(total_steps // 4 * 2**i, total_steps))
        if steps[-1] == total_steps:
            break
    return steps


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise WSDConfigError(f"WSDLrScheduler: {message}")


class WSDLrScheduler(StatefulSchedulerBase):
    """Warmup-Stable-Decay, stepped after every optimizer update.

    Args:
        optimizer: the optimizer.
        num_epochs: epochs (with ``num_update_steps_per_epoch``: ``total_steps`` is their product).
        num_update_steps_per_epoch: updates per epoch on each process.
        total_steps: updates in the run (instead of the two above).
        num_warmup_steps: linear warm-up updates from ``warmup_starting_lr`` (None: 1% of the run).
        decay_phase_ratio: the part of each checkpoint's period spent decaying, in [0, 1].
        lr_min: the lowest rate, as a fraction of each group's rate.
        warmup_starting_lr: the first warm-up rate (at most the largest group rate).
        use_inverse_sqrt_decay: ``1 - sqrt(t)``-shaped decay (else ``1 / (t (1/lr_min - 1) + 1)``).
        num_checkpoints: decayed checkpoints in the run (more than one: ``decay_phase_ratio`` <= 1/3).
        is_continuation_from_checkpoint: this run continues from a saved state (no warm-up).

    Raises:
        ValueError: epochs, updates per epoch and ``total_steps`` all given.
        WSDConfigError: a setting out of range (an ``AssertionError`` as well).

    Example:
        >>> create_scheduler_fn = WSDLrScheduler.create_scheduler_fn(num_checkpoints=2)
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        num_epochs: int | None = None,
        num_update_steps_per_epoch: int | None = None,
        total_steps: int | None = None,
        num_warmup_steps: int | None = 0,
        decay_phase_ratio: float = 0.1,
        lr_min: float = 1e-6,
        warmup_starting_lr: float = 1e-6,
        use_inverse_sqrt_decay: bool = True,
        num_checkpoints: int = 1,
        is_continuation_from_checkpoint: bool = False,
    ) -> None:
        super().__init__(optimizer)
        if num_epochs is not None and num_update_steps_per_epoch is not None:
            if total_steps is not None:
                raise ValueError("Only num_epochs and num_update_steps_per_epoch, or total_steps should be provided")
            total_steps = num_epochs * num_update_steps_per_epoch
        _check(isinstance(total_steps, int) and total_steps > 0, f"total_steps must be positive, got {total_steps!r}")
        assert total_steps is not None
        _check(0 <= decay_phase_ratio <= 1, f"decay_phase_ratio must be in [0, 1], got {decay_phase_ratio!r}")
        _check(lr_min >= 0, f"lr_min must be >= 0, got {lr_min!r}")
        _check(num_checkpoints > 0, f"num_checkpoints must be positive, got {num_checkpoints!r}")
        self.total_steps = total_steps
        self.num_warmup_steps = int(0.01 * total_steps) if num_warmup_steps is None else num_warmup_steps
        self.decay_phase_ratio, self.lr_min = decay_phase_ratio, lr_min
        self.warmup_starting_lr, self.use_inverse_sqrt_decay = warmup_starting_lr, use_inverse_sqrt_decay
        self.num_checkpoints = num_checkpoints
        self.checkpoint_steps = estimate_checkpoint_steps(total_steps, num_checkpoints)
        self.is_continuation_from_checkpoint = is_continuation_from_checkpoint
        self.previous_checkpoint_step: int | None = None
        self._get_checkpoint_info.cache_clear()
        if warmup_starting_lr > max(self.base_lr_values):
            raise ValueError("warmup_starting_lr should not exceed maximum base learning rate")
        if num_checkpoints > 1 and decay_phase_ratio > 1 / 3:
            raise ValueError(
                f"Decay phase ratio {decay_phase_ratio} is too large and may cause overlapping decay phases. "
                f"Maximum safe ratio is {1 / 3:.2f} with {num_checkpoints} checkpoints using geometric progression"
            )
        self.checkpoint_decay_info = self._calculate_decay_info()

    # -- the checkpoints' periods ----------------------------------------------------------------
    def _calculate_decay_info(self) -> list[dict[str, int]]:
        info = []
        for i, end in enumerate(self.checkpoint_steps):
            start = self.checkpoint_steps[i - 1] if i else 0
            decay = int((end - start) * self.decay_phase_ratio)
            info.append({"period_start": start, "period_end": end, "decay_steps": decay, "pre_decay_step": end - decay})
        return info

    def get_checkpoint_steps(self) -> list[int]:
        """The updates at which the decayed checkpoints fall."""
        return self.checkpoint_steps

    def get_decay_info(self) -> list[dict[str, int]]:
        """Per period: ``period_start``, ``period_end``, ``decay_steps``, ``pre_decay_step``."""
        return self.checkpoint_decay_info

    def get_phase_info(self, num_updates: int) -> dict[str, int]:
        """The period ``num_updates`` falls in (the last one past the end)."""
        return next((i for i in self.checkpoint_decay_info if i["period_end"] >= num_updates),
                    self.checkpoint_decay_info[-1])  # fmt: skip

    def get_current_step(self) -> int:
        """The updates counted so far (-1 before the first ``step``)."""
        return self._num_updates

    def get_current_phase_info(self) -> dict[str, int]:
        """:meth:`get_phase_info` of the current step."""
        return self.get_phase_info(self._num_updates)

    @functools.lru_cache(maxsize=1)  # noqa: B019 (one entry, cleared whenever the settings change)
    def _get_checkpoint_info(self, num_updates: int) -> tuple[int, int]:
        """``(period length, updates into the period)`` for ``num_updates``."""
        steps = (estimate_checkpoint_steps(self.total_steps, self.num_checkpoints)
                 if self.is_continuation_from_checkpoint else self.checkpoint_steps)  # fmt: skip
        index = next((i for i, end in enumerate(steps) if num_updates < end), 0)
        start = steps[index - 1] if index else 0
        return steps[index] - start, num_updates - start

    # -- the rates ------------------------------------------------------------------------------
    def get_updated_values(self, num_updates: int) -> Any:
        """Each group's rate after ``num_updates`` updates."""
        if not self.is_continuation_from_checkpoint and num_updates < self.num_warmup_steps:
            start = self.warmup_starting_lr
            return [start + (num_updates / self.num_warmup_steps) * (lr - start) for lr in self.base_lr_values]
        period, into = self._get_checkpoint_info(num_updates)
        decay_steps = int(period * self.decay_phase_ratio)
        decay_start = period - decay_steps
        if self.is_continuation_from_checkpoint and into < decay_start:
            return self.base_lr_values
        if into == decay_start - 1:
            self.previous_checkpoint_step = num_updates
        if into < decay_start:
            return self.base_lr_values
        t = min((into - decay_start) / decay_steps, 1.0)
        if self.use_inverse_sqrt_decay:
            return [lr * (self.lr_min + (1 - self.lr_min) * (1 - math.sqrt(t))) for lr in self.base_lr_values]
        return [lr / (t * (1.0 / self.lr_min) + (1.0 - t) * 1.0) for lr in self.base_lr_values]

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The schedule's public attributes (as pytorch-accelerated: not the update count)."""
        self._get_checkpoint_info.cache_clear()
        return {k: v for k, v in self.__dict__.items() if k != "optimizer" and not k.startswith("_")}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; a continuation keeps its own ``total_steps`` and starts a
        new stable phase over it."""
        self._get_checkpoint_info.cache_clear()
        continuing, new_total = self.is_continuation_from_checkpoint, self.total_steps
        self.__dict__.update({k: v for k, v in state_dict.items() if k != "optimizer"})
        if continuing:
            self.total_steps = new_total
            self._step_count = 0
            self.previous_checkpoint_step = None
            self.checkpoint_steps = estimate_checkpoint_steps(self.total_steps, self.num_checkpoints)
            self.checkpoint_decay_info = self._calculate_decay_info()

    @classmethod
    def create_scheduler_fn(
        cls,
        total_num_epochs: Any = Placeholders.NUM_EPOCHS,
        num_update_steps_per_epoch: Any = None,
        num_warmup_epochs: int | None = None,
        decay_phase_ratio: float = 0.1,
        lr_min: float = 1e-6,
        warmup_starting_lr: float = 1e-6,
        use_inverse_sqrt_decay: bool = True,
        num_checkpoints: int = 1,
        is_continuation_from_checkpoint: bool = False,
    ) -> Callable[[torch.optim.Optimizer], WSDLrScheduler]:
        """A ``create_scheduler_fn`` for ``Trainer.train``: the epochs and each process's updates per
        epoch default to the run's (the Trainer fills them in); warm-up in epochs (None: 1% of the run).

        Returns:
            A ``functools.partial`` that builds the scheduler from the optimizer.
        """
        from ..trainer import TrainerPlaceholderValues

        per_epoch = TrainerPlaceholderValues.PER_PROCESS_NUM_UPDATE_STEPS_PER_EPOCH
        steps: Any = per_epoch if num_update_steps_per_epoch is None else num_update_steps_per_epoch
        warmup: Any = None if num_warmup_epochs is None else per_epoch * num_warmup_epochs
        return functools.partial(
            cls, num_epochs=total_num_epochs, num_update_steps_per_epoch=steps, num_warmup_steps=warmup,
            decay_phase_ratio=decay_phase_ratio, lr_min=lr_min, warmup_starting_lr=warmup_starting_lr,
            use_inverse_sqrt_decay=use_inverse_sqrt_decay, num_checkpoints=num_checkpoints,
            is_continuation_from_checkpoint=is_continuation_from_checkpoint,
        )  # fmt: skip
