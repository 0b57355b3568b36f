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
from ember.parallel.pipeline import check_microbatches
from ember.parallel.policy import ShardedPolicy, require_boundary
from ember.parallel.strategy import check_parallel
from tests.parallel.common import dataset, mlp, stack_gpt, tiny_gpt


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


def _pipe(pipeline: Any, model: nn.Module | None = None, world: int = 2, **more: Any) -> Any:
    """check_parallel for pipeline settings on ``world`` processes (no process group is needed);
    ``parallel_data=``/``parallel_tensor=`` set the other sizes (``parallel_data=None``: data=2)."""
    parallel: dict[str, Any] = {"pipeline": pipeline}
    if "parallel_data" in more:
        more.pop("parallel_data")
        parallel["data"] = 2
    if "parallel_tensor" in more:
        parallel["tensor"] = more.pop("parallel_tensor")
    return _check({"parallel": parallel, **more}, world, model or stack_gpt())


class RootParameter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)
        self.b.weight = self.a.weight


def _microbatches(batch: int, microbatches: int) -> None:
    loader = torch.utils.data.DataLoader(dataset(40), batch_size=batch)
    check_microbatches(loader, load_config({"parallel": {"pipeline": {"size": 2, "microbatches": microbatches}}}))


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
    ("pipeline size that does not fit one process", lambda: _init({"parallel": {"pipeline": 2}}), "parallel.pipeline"),
    ("pipeline x data x tensor is not the world", lambda: _pipe(2, mlp(), parallel_data=None), "parallel.data=2"),
    (
        "pipeline split point that does not exist",
        lambda: _pipe({"size": 2, "split_points": ["blocks.9"]}),
        "'blocks.9'",
    ),
    ("pipeline split points, too many", lambda: _pipe({"size": 2, "split_points": ["blocks.1", "head"]}), "give 1"),
    ("pipeline split points out of order", lambda: _pipe({"size": 3, "split_points": ["head", "blocks.1"]}), "order"),
    ("microbatches that do not divide the batch", lambda: _microbatches(10, 4), "microbatches=4"),
    (
        "1f1b with fewer microbatches than stages",
        lambda: _pipe({"size": 2, "microbatches": 1, "schedule": "1f1b"}),
        "1f1b",
    ),
    ("pipeline with zero stage 3", lambda: _pipe(2, zero={"stage": 3}), "zero.stage=3"),
    ("pipeline with zero stage 2", lambda: _pipe(2, zero={"stage": 2}), "Pipeline parallelism runs as"),
    (
        "pipeline with zero stage 1 and tensor parallel",
        lambda: _pipe(2, world=4, parallel_tensor=2, zero={"stage": 1}),
        "together with parallel.tensor.size=2",
    ),
    (
        "pipeline x tensor with a plan entry matching no module of any stage",
        lambda: _pipe(2, world=4, parallel_tensor={"size": 2, "plan": {"blocks.*.attn.qproj": "colwise"}}),
        "did you mean",
    ),
    ("pipeline with more stages than layers", lambda: _pipe(4, mlp(), world=4), "only 3 layers"),
    ("pipeline with a parameter on the root module", lambda: _pipe(2, RootParameter()), "['scale']"),
    ("pipeline stages sharing a parameter", lambda: _pipe(2, Tied()), "tied weights"),
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


def test_missing_split_point_error_lists_the_top_level_children() -> None:
    with pytest.raises(ConfigError) as info:
        _pipe({"size": 2, "split_points": ["blocks.9"]})
    assert "['embed', 'blocks', 'pool', 'head']" in str(info.value)


def test_pipeline_split_is_checked_in_one_process() -> None:
    plan = _pipe({"size": 2, "split_points": ["blocks.3"]})
    assert plan.pipeline_stages == (("embed", "blocks.0", "blocks.1", "blocks.2"), ("blocks.3", "pool", "head"))
    assert _pipe(3, world=3).pipeline_stages == (("embed", "blocks.0", "blocks.1"), ("blocks.2", "blocks.3"),
                                                  ("pool", "head"))  # fmt: skip


def test_pipeline_with_fp16_is_accepted() -> None:
    """The ranks agree on an overflow (one loss scale for every stage): fp16 is no longer refused."""
    assert _pipe(2, amp="fp16").pipeline_stages is not None


def test_pipeline_with_tensor_parallel_is_accepted_and_keeps_the_plan() -> None:
    plan = _pipe({"size": 2, "split_points": ["blocks.2"]}, world=4, parallel_tensor=2)  # plan=None: recognised
    assert plan.layout.pipeline == 2 and plan.layout.tensor == 2
    assert plan.tensor_plan is not None and plan.tensor_plan["blocks.3.mlp.fc2"] == "rowwise"
    assert _pipe(2, world=4, parallel_data=None, zero={"stage": 1}).zero_stage == 1  # pipeline × data, ZeRO-1


def test_optimizer_errors_are_engine_errors_and_wrong_sizes_config_errors() -> None:
    with pytest.raises(EngineError):
        _lbfgs()
    with pytest.raises(ConfigError, match="Sizes that fit: data=4 tensor=1 pipeline=1; data=2 tensor=2"):
        _check({"parallel": {"data": 3}}, 4)
