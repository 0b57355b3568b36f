"""What ``trainer.model`` and ``trainer.optimizer`` are in the pytorch-accelerated compat: the
Engine's model and optimizer, seen through pytorch-accelerated's names."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

import ember
from ember.errors import TrainerError


class PreparedModel:
    """What ``trainer.model`` is: the user's model, whose calls run through the Engine (autocast,
    DDP, the device) and whose other attributes are the model's own."""

    def __init__(self, engine: ember.Engine) -> None:
        self._engine = engine

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._engine(*args, **kwargs)

    def train(self, mode: bool = True) -> PreparedModel:
        self._engine.train(mode)
        return self

    def eval(self) -> PreparedModel:
        return self.train(False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine.model, name)

    def __repr__(self) -> str:
        return f"prepared {self._engine.model!r}"


class PreparedOptimizer(torch.optim.Optimizer):
    """What ``trainer.optimizer`` is: the Engine's optimizer, whose ``step`` is the Engine's
    (unscaling, clipping and the fp16 scaler included) and whose ``zero_grad`` clears at the
    start of an accumulation cycle. Schedulers built over it drive the Engine's optimizer."""

    def __init__(self, engine: ember.Engine) -> None:  # no super().__init__: the state is the Engine's
        self._engine = engine
        self.applied = False
        """Whether the last ``step`` updated the parameters (False: a micro-step or an fp16 skip)."""

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self._engine.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self._engine.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:
        return self._engine.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self._engine.optimizer.defaults = value

    @property
    def state(self) -> Any:
        return self._engine.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self._engine.optimizer.state = value

    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise TrainerError("the prepared optimizer's step() takes no closure: compute the loss before it")
        # Gradients from engine.backward: the Engine's update (parameters unfrozen since the Engine
        # was built, as pets_finetune's ModelFreezer.unfreeze does, are averaged by the Engine too).
        if self._engine.micro_step > 0:
            self.applied = self._engine.step()
        else:  # gradients from a plain loss.backward() outside train(): the optimizer's own step
            self._engine.optimizer.step()
            self.applied = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._engine.zero_grad()

    def state_dict(self) -> dict[str, Any]:
        return self._engine.optimizer.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._engine.optimizer.load_state_dict(dict(state_dict))

    def __repr__(self) -> str:
        return f"prepared {self._engine.optimizer!r}"
