"""Precision policies: full precision, bf16 autocast, fp16 autocast with torch's GradScaler.

The Engine has one step; what differs between precisions lives in small classes that override
only what differs (mmengine's optimizer wrapper and its AMP variant are the model).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


class Precision:
    """Full precision: no autocast, no scaling; every update is applied."""

    name: str | None = None
    autocasts = False
    """Whether :meth:`autocast` does anything (the Engine skips entering it otherwise)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The context the forward pass and the loss run in."""
        yield

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The tensor to call ``backward`` on."""
        return loss

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to their true scale before clipping or inspection."""

    def gradient_params(self, params: list[nn.Parameter]) -> list[nn.Parameter]:
        """Where ``backward`` leaves the gradients of the optimizer's ``params`` (the model's own
        low-precision parameters under :class:`MasterWeights`; ``params`` themselves otherwise)."""
        return params

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """Clear every gradient the next cycle accumulates into."""
        optimizer.zero_grad(set_to_none=True)

    def full_precision(self) -> contextlib.AbstractContextManager[None]:
        """The context the Engine saves and loads weights in (see :meth:`MasterWeights.full_precision`)."""
        return contextlib.nullcontext()

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Apply the update; return False when it was skipped."""
        optimizer.step()
        return True

    @property
    def loss_scale(self) -> float:
        """The factor losses are multiplied by before ``backward`` (1 without a scaler)."""
        return 1.0

    def state_dict(self) -> dict[str, Any]:
        """State to checkpoint (the scaler's, for fp16)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


class AutocastPrecision(Precision):
    """Autocast the forward pass to a lower-precision dtype (bf16 needs no loss scaling)."""

    autocasts = True

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(device)
        self.dtype = dtype
        self.name = "bf16" if dtype == torch.bfloat16 else "fp16"

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        with torch.autocast(device_type=self.device.type, dtype=self.dtype):
            yield


class ScaledPrecision(AutocastPrecision):
    """fp16 autocast with a gradient scaler; an overflowed update is skipped, not applied."""

    def __init__(self, device: torch.device, scaler_options: dict[str, Any] | None = None) -> None:
        super().__init__(device, torch.float16)
        self.scaler = torch.amp.GradScaler(device.type, **(scaler_options or {}))
        self._last_scale: float | None = None

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        if self._last_scale is None:
            self._last_scale = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        # The scaler backs its scale off exactly when it skipped the update. It has already
        # synchronised with the device inside step(), so reading the scale costs nothing more.
        scale = self.scaler.get_scale()
        skipped = scale < self._last_scale
        self._last_scale = scale
        return not skipped

    @property
    def loss_scale(self) -> float:
        """The scaler's current scale (reading it waits for the device)."""
        return float(self.scaler.get_scale())

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        self._last_scale = None
