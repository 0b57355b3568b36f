"""The 2-D / 2.5-D / 3-D / 1-D layers in one process: placement, state dicts, Colossal-AI names, bad input.

A grid of one rank computes what torch's modules compute; a grid of 4 or 8 ranks can be built in
one process as long as nothing communicates (building layers and loading whole tensors cut them
locally), which is how these tests check where each block goes. The multi-process proofs are in
``test_grid_equivalence.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import ember
from ember.config import load_config
from ember.errors import CheckpointError, ConfigError, EmberError, EngineError
from ember.layout import ParallelLayout
from ember.parallel.grid import grid_of, reset_grids, shard_specs
from ember.parallel.layers import layers_for
from ember.parallel.strategy import check_parallel
from tests.parallel.common import tiny_gpt
from tests.parallel.vit import ViT, images


@pytest.fixture(autouse=True)
def _fresh_grids() -> Any:
    reset_grids()
    yield
    reset_grids()


def grid(mode: str, size: int = 1, depth: int | None = None) -> Any:
    tensor = {"size": size, "mode": mode} | ({"depth": depth} if depth else {})
    return grid_of(ParallelLayout.from_config({"tensor": tensor}, size))


@pytest.mark.parametrize(("mode", "depth"), [("1d", None), ("2d", None), ("2.5d", 1), ("3d", None)])
def test_a_one_rank_grid_vit_computes_what_torchs_modules_compute(mode: str, depth: int | None) -> None:
    torch.manual_seed(0)
    ref = ViT(layers_for(None))
    L = layers_for(grid(mode, 1, depth))
    model = ViT(L)
    model.load_state_dict(ref.state_dict())
    assert all(torch.equal(v, ref.state_dict()[k]) for k, v in model.state_dict().items())
    x, y = images(4).tensors
    loss = L.CrossEntropyLoss()(model(x), y)
    ref_loss = nn.functional.cross_entropy(ref(x), y)
    loss.backward(), ref_loss.backward()
    assert abs(loss.item() - ref_loss.item()) < 1e-6
    grads = dict(ref.named_parameters())
    assert max((p.grad - grads[n].grad).abs().max().item() for n, p in model.named_parameters()) < 1e-6


def test_whole_tensors_are_cut_into_the_blocks_each_mode_places() -> None:
    """Loading whole tensors keeps this rank's block (rank 0 here): 2-D ``W[out block j, in block i]``,
    3-D ``W[out block (input), in block (output) sub-block (weight)]``, 2.5-D replicated over depth."""
    w = torch.arange(8 * 16, dtype=torch.float32).reshape(8, 16)  # [out, in]
    for g, rows, cols in (
        (grid("2d", 4), slice(0, 4), slice(0, 8)),
        (grid("2.5d", 8, 2), slice(0, 4), slice(0, 8)),
        (grid("3d", 8), slice(0, 4), slice(0, 4)),
    ):
        layer = layers_for(g).Linear(16, 8)
        layer.load_state_dict({"weight": w, "bias": torch.zeros(8)})
        assert torch.equal(layer.weight, w[rows, cols]), g
        assert layer.bias.shape == (4,)
    norm = layers_for(grid("3d", 8)).LayerNorm(8)
    assert norm.weight.shape == (4,) and shard_specs(norm)["weight"].replicas == 4


def test_every_rank_of_a_layout_draws_the_same_model() -> None:
    """Parameters are drawn whole from the config seed and the parameter's index, then cut: two
    builds on one grid layout give the same blocks as one build on another grid of that layout."""
    a = layers_for(grid_of(ParallelLayout(tensor=4, tensor_mode="2d"))).Linear(8, 8)
    reset_grids()
    b = layers_for(grid_of(ParallelLayout(tensor=4, tensor_mode="2d"))).Linear(8, 8)
    assert torch.equal(a.weight, b.weight)


def test_grid_engine_in_one_process_trains_and_saves_whole_state() -> None:
    ember.launch(config={"seed": 0, "parallel": {"tensor": {"size": 1, "mode": "2d"}}}, verbose=False)
    try:
        L = layers_for(grid_of(ember.context.layout))
        model = ViT(L)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        loader = ember.get_dataloader(images(16), batch_size=8)
        engine, loader, _, _ = ember.initialize(model, opt, L.CrossEntropyLoss(), loader)
        for x, y in loader:
            engine.zero_grad()
            engine.backward(engine.criterion(engine(x), y))
            assert engine.step()
        assert engine.parallel.name == "none"  # one process: the plain policy (every block is whole)
        state = engine.state_dict()
        assert sorted(state["model"]) == sorted(ViT(layers_for(None)).state_dict())
        assert len(state["optimizer"]["state"]) == len(list(model.parameters()))
    finally:
        ember.context.reset()


class Mixed(nn.Module):
    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.grid_layer, self.plain = layer, nn.Linear(8, 8)


def _check(parallel: dict[str, Any], model: nn.Module, world: int, **more: Any) -> Any:
    return check_parallel(
        load_config({"parallel": parallel, **more}), model, torch.optim.SGD(model.parameters(), lr=0.1), world
    )


TWO_D = {"tensor": {"size": 4, "mode": "2d"}}


def _conv() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(4, 4))


CASES: list[tuple[str, Callable[[], object], type[EmberError], str]] = [
    ("a layer built before launch", lambda: ember.parallel.tensor2d.Linear2D(8, 8), ConfigError, "before ember.launch"),
    ("features the grid does not divide", lambda: layers_for(grid("2d", 4)).Linear(5, 8), ConfigError, "in_features=5"),
    ("3-D in-features not divisible by q²", lambda: layers_for(grid("3d", 8)).Linear(6, 8), ConfigError, "by 4"),
    ("a layer given a grid of another mode", lambda: ember.parallel.tensor3d.Linear3D(8, 8, grid=grid("2d", 4)),
     ConfigError, "got a grid of mode '2d'"),
    ("a parameter no layer places", lambda: _check(TWO_D, Mixed(layers_for(grid("2d", 4)).Linear(8, 8)), 4),
     ConfigError, "module 'plain' (Linear)"),
    ("layers of another layout", lambda: _check({"tensor": {"size": 4, "mode": "2.5d", "depth": 1}},
                                                ViT(layers_for(grid("2d", 4))), 4), ConfigError, "was built on"),
    ("a plain model under 3-D", lambda: _check({"tensor": {"size": 8, "mode": "3d"}}, tiny_gpt(), 8), ConfigError,
     "needs the model built from its layers"),
    ("1-D grid layers with context parallelism", lambda: _check({"context": 2, "tensor": {"size": 2, "mode": "1d"}},
                                                                ViT(layers_for(grid("1d", 2))), 4), ConfigError,
     "parallel.context=2 with a model built from ember.parallel.tensor1d"),
    ("a plain module 2-D cannot place", lambda: _check(TWO_D, _conv(), 4), ConfigError, "module '0' (Conv2d)"),
    ("a plain Linear 2-D cannot split", lambda: _check(TWO_D, nn.Sequential(nn.Linear(8, 3)), 4), ConfigError,
     "'0' has {'out_features': 3}"),
    ("zero with a 2-D grid", lambda: _check(TWO_D, tiny_gpt(), 4, zero={"stage": 2}), ConfigError, "zero.stage=2"),
    ("a plan with a 2-D grid", lambda: _check({"tensor": {"size": 4, "mode": "2d", "plan": {"x": "colwise"}}},
                                              tiny_gpt(), 4), ConfigError, "plan applies to mode='1d'"),
    ("a shard loaded as a whole tensor", lambda: layers_for(grid("2d", 4)).Linear(8, 8).load_state_dict(
        {"weight": torch.zeros(4, 4), "bias": torch.zeros(8)}), CheckpointError, "one rank's shard"),
    ("an input without the grid's feature block", lambda: layers_for(grid("2d")).Linear(8, 8)(torch.zeros(2, 6)),
     EngineError, "features along tensor_row"),
    ("torch's reduction given to a grid loss", lambda: layers_for(grid("2d")).CrossEntropyLoss(size_average=True),
     ConfigError, "not ['size_average']"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "call", "kind", "culprit"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_one_clear_error_naming_the_culprit(
    what: str, call: Callable[[], object], kind: type[EmberError], culprit: str
) -> None:
    with pytest.raises(kind) as info:
        call()
    assert culprit in str(info.value)


def test_a_new_launch_gets_a_new_grid_and_one_launch_shares_one() -> None:
    """Layers built under one launch share its grid (3-D's roles, the parameter seeds); after
    ``ember.context.reset()`` and another launch the old grid, whose groups are gone, is not reused."""
    config = {"parallel": {"tensor": {"size": 1, "mode": "3d"}}}
    ember.launch(config=config, verbose=False)
    first = grid_of(ember.context.layout)
    assert grid_of(ember.context.layout) is first
    ember.context.reset()
    ember.launch(config=config, verbose=False)
    try:
        assert grid_of(ember.context.layout) is not first
    finally:
        ember.context.reset()


def test_a_pipeline_reorders_rows_so_each_grid_rank_ends_with_its_block_of_the_batch() -> None:
    from ember.errors import DataError
    from ember.parallel.pipeline_schedule import PipelineSchedule

    schedule = PipelineSchedule.__new__(PipelineSchedule)  # no process group needed for the reordering
    schedule.row_blocks = 2
    x, label = torch.arange(16).reshape(8, 2), torch.arange(8)
    args, kwargs, order = schedule._interleave((x,), {"mask": x[:, 0]}, label, size=8, micro=2)
    # micro-batch j = rows [4j, 4j + 4), row block i of it = 2 rows; rank block i's merged rows:
    merged = [torch.cat([order[4 * j + 2 * i : 4 * j + 2 * i + 2] for j in range(2)]) for i in range(2)]
    assert [m.tolist() for m in merged] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert torch.equal(args[0][:, 0] // 2, order) and torch.equal(kwargs["mask"] // 2, order)
    with pytest.raises(DataError, match="multiple of 4"):
        schedule._interleave((x[:6],), {}, label[:6], size=6, micro=2)
