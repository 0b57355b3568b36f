"""An exponential moving average of the model's weights, optionally used for evaluation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ember.errors import HookError
from ember.trainer.hooks.base import BaseHook, Priority

__all__ = ["EMAHook"]


class EMAHook(BaseHook):
    """Keeps ``ema = decay * ema + (1 - decay) * weights`` after every optimizer update.

    Floating parameters and buffers are averaged (low-precision ones in float32); integer
    buffers are copied. The update is a few fused device ops per step, with no host sync.
    With ``eval_with_ema=True`` every test pass runs on the averaged weights, and the
    training weights are put back afterwards (also if the pass raised).

    Args:
        decay: the averaging factor in [0, 1]; 0.999 averages over about 1,000 updates.
        eval_with_ema: evaluate with the averaged weights.
        warmup: use ``min(decay, (1 + n) / (10 + n))`` at update ``n`` so early averages
            are not dominated by the random initialisation.
        priority: default ``HIGH`` (the average is current before anything reads it).
        name: hook name.

    Example:
        >>> ema = hooks.EMAHook(decay=0.999, eval_with_ema=True)
        >>> trainer.fit(train_dl, epochs=5, test_dataloader=test_dl, hooks=[ema, hooks.AccuracyHook()])
        >>> ema.copy_to(export_model)             # the averaged weights, for saving
    """

    def __init__(
        self,
        decay: float = 0.999,
        eval_with_ema: bool = False,
        warmup: bool = False,
        priority: int | str = Priority.HIGH,
        name: str | None = None,
    ) -> None:
        super().__init__(priority, name)
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 <= decay <= 1.0:
            raise HookError(f"EMAHook(decay=...) must be a number in [0, 1], got {decay!r}")
        self.decay, self.eval_with_ema, self.warmup = float(decay), bool(eval_with_ema), bool(warmup)
        self.num_updates = 0
        self.shadow: dict[str, torch.Tensor] = {}
        self._backup: list[torch.Tensor] | None = None
        self._pending: Mapping[str, torch.Tensor] | None = None

    def _tensors(self) -> list[tuple[str, torch.Tensor]]:
        model: nn.Module = self.trainer.engine.model
        return [*model.named_parameters(), *model.named_buffers()]

    def before_train(self) -> None:
        """Start the average from the current weights (or from a loaded state)."""
        if not self.shadow:
            self.shadow = {name: _shadow_of(t) for name, t in self._tensors()}
        if self._pending is not None:
            self._load_shadow(self._pending)
            self._pending = None

    def after_update(self) -> None:
        """Fold the new weights into the average after an applied update."""
        n = self.num_updates
        decay = min(self.decay, (1 + n) / (10 + n)) if self.warmup else self.decay
        weight = 1.0 - decay
        groups: dict[torch.dtype, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        with torch.no_grad():
            for name, t in self._tensors():
                s = self.shadow[name]
                if s.is_floating_point():
                    g = groups.setdefault(s.dtype, ([], []))
                    g[0].append(s)
                    g[1].append(t.detach().to(s.dtype))
                else:
                    s.copy_(t)
            for shadows, currents in groups.values():
                torch._foreach_lerp_(shadows, currents, weight)
        self.num_updates += 1

    def before_test(self) -> None:
        """Swap the averaged weights in (``eval_with_ema``)."""
        if self.eval_with_ema and self.shadow and self._backup is None:
            tensors = self._tensors()
            with torch.no_grad():
                self._backup = [t.detach().clone() for _, t in tensors]
                for name, t in tensors:
                    t.copy_(self.shadow[name])

    def after_test(self) -> None:
        """Put the training weights back."""
        self._restore()

    def after_train(self) -> None:
        """Put the training weights back if a test pass was cut short."""
        self._restore()

    def _restore(self) -> None:
        if self._backup is None:
            return
        with torch.no_grad():
            for (_, t), saved in zip(self._tensors(), self._backup, strict=True):
                t.copy_(saved)
        self._backup = None

    def copy_to(self, module: nn.Module) -> None:
        """Load the averaged weights into ``module`` (same architecture as the trained model)."""
        module.load_state_dict(self.ema_state_dict())

    def ema_state_dict(self) -> dict[str, torch.Tensor]:
        """The averaged weights as a model ``state_dict`` (in the model's dtypes)."""
        if not self.shadow:
            raise HookError("EMAHook has no average yet: it starts when fit starts")
        model_state = self.trainer.engine.model.state_dict()
        return {k: self.shadow[k].to(v.dtype) if k in self.shadow else v for k, v in model_state.items()}

    def state_dict(self) -> dict[str, Any]:
        """The averaged tensors and the number of updates folded in."""
        shadow = self.shadow or dict(self._pending or {})
        return {"shadow": {k: v.detach().clone() for k, v in shadow.items()}, "num_updates": self.num_updates}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the average (applied when fit starts if it has not yet)."""
        if "shadow" not in state:
            raise HookError(f"hook {self.name!r}: state has no 'shadow'; pass what state_dict() returned")
        self.num_updates = int(state.get("num_updates", 0))
        if self.shadow:
            self._load_shadow(state["shadow"])
        else:
            self._pending = state["shadow"]

    def _load_shadow(self, saved: Mapping[str, torch.Tensor]) -> None:
        missing = sorted(set(self.shadow) - set(saved))
        if missing:
            raise HookError(f"EMAHook state lacks tensors for {missing[:5]}: was it saved from another model?")
        for name, s in self.shadow.items():
            s.copy_(saved[name].to(s.device, s.dtype))


def _shadow_of(t: torch.Tensor) -> torch.Tensor:
    s = t.detach().clone()
    if s.is_floating_point() and s.dtype in (torch.float16, torch.bfloat16):
        s = s.float()
    return s
