"""Bad parallel settings get one clear ember error, in one process, before any collective."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import ember
from ember.config import load_config
from ember.errors import ConfigError, EmberError, EngineError
from ember.parallel.optim import rebuild_optimizer
from ember.parallel.policy import ShardedPolicy, require_boundary
from ember.parallel.strategy import check_parallel
from tests.parallel.common import mlp, tiny_gpt


class ConvNet(nn.Module):
    """A model with no block that ember has a ready tensor-parallel plan for."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.conv(x).mean(dim=(2, 3)))


class ClosureOnly(torch.optim.SGD):
    """An optimizer whose step needs a closure."""

    def step(self, closure: Callable[[], Any]) -> Any:  # type: ignore[override]
        return super().step(closure)


class NeedsExtraArgument(torch.optim.SGD):
    def __init__(self, params: Any, special: int) -> None:
        super().__init__(params, lr=0.1)


def _init(config: dict[str, Any], model: nn.Module | None = None, optimizer: Any = None) -> Any:
    model = model or mlp()
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.1)
    return ember.initialize(model, optimizer, nn.CrossEntropyLoss(), config=config)


def _check(config: dict[str, Any], world_size: int, model: nn.Module | None = None) -> Any:
    model = model or mlp()
    return check_parallel(load_config(config), model, torch.optim.SGD(model.parameters(), lr=0.1), world_size)


def _tp(plan: Any, model: nn.Module | None = None, size: int = 2) -> Any:
    """check_parallel for ``size`` tensor-parallel processes (no process group is needed)."""
    return _check({"parallel": {"tensor": {"size": size, "plan": plan}}}, size, model)


def _stepped_optimizer() -> Any:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    return _init({"zero": 3}, model, opt)


def _lbfgs() -> Any:
    model = mlp()
    return _init({"zero": {"stage": 3}}, model, torch.optim.LBFGS(model.parameters()))


def _closure_only() -> Any:
    model = mlp()
    return _init({"zero": {"stage": 2}}, model, ClosureOnly(model.parameters(), lr=0.1))


def _unrebuildable() -> Any:
    model = mlp()
    return rebuild_optimizer(NeedsExtraArgument(model.parameters(), 1), model, {}, "zero stage 3")


CASES: list[tuple[str, Callable[[], object], str]] = [
    ("tensor size that does not fit at launch", lambda: ember.launch(config={"parallel": {"tensor": 3}}), "tensor=1"),
    ("data size that does not fit", lambda: _check({"parallel": {"data": 3}}, 4), "data=2 tensor=2 pipeline=1"),
    ("sizes whose product is not the world", lambda: _check({"parallel": {"tensor": 3}}, 4), "parallel.tensor.size=3"),
    ("model with no plan and nothing recognised", lambda: _tp(None, ConvNet()), "parallel.tensor.plan="),
    ("plan entry matching no module", lambda: _tp({"blocks.*.x": "colwise"}, tiny_gpt()), "blocks.*.x"),
    ("plan with an unknown style", lambda: _tp({"0": "diagonal"}), "diagonal"),
    ("colwise on a non-Linear", lambda: _tp({"1": "colwise"}), "Tanh"),
    ("dimension not divisible by the tensor size", lambda: _tp({"0": "colwise"}, size=3), "out_features=16"),
    (
        "tensor mode other than 1d",
        lambda: _init({"parallel": {"tensor": {"size": 2, "mode": "2.5d"}}}),
        "parallel.tensor.mode",
    ),
    ("pipeline parallel (not in this version)", lambda: _init({"parallel": {"pipeline": 2}}), "parallel.pipeline"),
    ("zero stage 3 with LBFGS", _lbfgs, "LBFGS"),
    ("zero with an optimizer whose step needs a closure", _closure_only, "closure"),
    ("zero with an optimizer that already stepped", _stepped_optimizer, "already has state"),
    ("an optimizer ember cannot rebuild", _unrebuildable, "NeedsExtraArgument"),
    (
        "zero stage 1 with mixed_precision",
        lambda: _init({"zero": {"stage": 1, "mixed_precision": "bf16"}}),
        "zero.mixed_precision",
    ),
    ("zero stage 1 with tensor parallel", lambda: _init({"zero": 1, "parallel": {"tensor": 2}}), "zero.stage=1"),
    ("data x tensor without zero 2 or 3", lambda: _check({"parallel": {"tensor": 2}}, 4), "zero=dict(stage=2)"),
    (
        "sharded state saved mid-cycle",
        lambda: require_boundary(ShardedPolicy(None, "FSDP2"), 1),
        "accumulation boundary",
    ),
]


@pytest.mark.parametrize(("what", "call", "culprit"), CASES, ids=[c[0] for c in CASES])
def test_bad_parallel_input_raises_one_ember_error_naming_the_culprit(
    what: str, call: Callable[[], object], culprit: str
) -> None:
    with pytest.raises(EmberError) as info:
        call()
    assert culprit in str(info.value)
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__


def test_missing_plan_error_says_what_to_add() -> None:
    with pytest.raises(ConfigError) as info:
        _tp(None, ConvNet())
    message = str(info.value)
    assert "parallel.tensor.plan=" in message and "plans.mlp" in message and "out" in message  # lists its Linears


def test_optimizer_errors_are_engine_errors_and_wrong_sizes_config_errors() -> None:
    with pytest.raises(EngineError):
        _lbfgs()
    with pytest.raises(ConfigError, match="Sizes that fit: data=4 tensor=1 pipeline=1; data=2 tensor=2"):
        _check({"parallel": {"data": 3}}, 4)
