"""The layout, context coordinates, plans, optimizer rebuild and data sharding, in one process."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import ember
from ember.context import ParallelLayout
from ember.data import ResumableSampler, make_resumable
from ember.errors import ConfigError, LaunchError
from ember.parallel import plans
from ember.parallel.optim import make_view, parameter_names, rebuild_optimizer, retarget_scheduler, shares_param_groups
from ember.parallel.tensor import resolve_plan
from tests.models import params_of, tiny_dataset
from tests.parallel.common import adamw_groups, mlp, tiny_gpt


@pytest.mark.parametrize(
    ("parallel", "world", "expected"),
    [
        ({}, 4, ParallelLayout(1, 4, 1)),
        ({"tensor": {"size": 2}}, 4, ParallelLayout(1, 2, 2)),
        ({"data": 2, "tensor": {"size": 2}}, 4, ParallelLayout(1, 2, 2)),
        ({"tensor": {"size": 4}}, 4, ParallelLayout(1, 1, 4)),
        ({"pipeline": {"size": 2}, "tensor": {"size": 2}}, 8, ParallelLayout(2, 2, 2)),
    ],
)
def test_layout_fills_data_from_the_world(parallel: dict, world: int, expected: ParallelLayout) -> None:
    assert ParallelLayout.from_config(parallel, world) == expected


def test_coordinates_put_tensor_innermost_and_cover_every_rank_once() -> None:
    layout = ParallelLayout(pipeline=2, data=3, tensor=2)
    coords = [layout.coords(r) for r in range(12)]
    assert coords[1] == {"pipeline": 0, "data": 0, "context": 0, "tensor": 1}
    assert coords[2] == {"pipeline": 0, "data": 1, "context": 0, "tensor": 0}
    assert coords[6] == {"pipeline": 1, "data": 0, "context": 0, "tensor": 0}
    assert len({tuple(c.values()) for c in coords}) == 12
    for rank, c in enumerate(coords):  # the same order as DeviceMesh's row-major ranks
        assert (c["pipeline"] * 3 + c["data"]) * 2 + c["tensor"] == rank


def test_context_sits_between_data_and_tensor() -> None:
    layout = ParallelLayout.from_config({"context": 2, "tensor": 2, "pipeline": 2}, 16)
    assert (layout.data, layout.world_size, layout.shape) == (2, 16, (2, 2, 2, 2))
    for rank in range(16):
        c = layout.coords(rank)
        assert ((c["pipeline"] * 2 + c["data"]) * 2 + c["context"]) * 2 + c["tensor"] == rank
    assert layout.group_ranks("context")[:2] == [[0, 2], [1, 3]]


@pytest.mark.parametrize(
    ("tensor", "names", "sizes"),
    [
        ({"size": 4, "mode": "2d"}, ("tensor_col", "tensor_row"), (2, 2)),
        ({"size": 8, "mode": "2.5d", "depth": 2}, ("tensor_dep", "tensor_col", "tensor_row"), (2, 2, 2)),
        ({"size": 8, "mode": "3d"}, ("tensor_output", "tensor_input", "tensor_weight"), (2, 2, 2)),
        ({"size": 9, "mode": "2d"}, ("tensor_col", "tensor_row"), (3, 3)),
    ],
)
def test_tensor_modes_split_the_tensor_dim_row_major(tensor: dict, names: tuple, sizes: tuple) -> None:
    world = tensor["size"] * 2
    layout = ParallelLayout.from_config({"tensor": tensor}, world)
    assert layout.fine_dims[-len(names) :] == tuple(zip(names, sizes, strict=True))
    for rank in range(world):
        c = layout.coords(rank)
        flat = 0
        for name, size in zip(names, sizes, strict=True):
            flat = flat * size + c[name]
        assert flat == c["tensor"] and c["data"] * tensor["size"] + c["tensor"] == rank
    for name in names:  # each sub-dimension's groups partition the world, each member at its coordinate
        groups = layout.group_ranks(name)
        assert sorted(r for g in groups for r in g) == list(range(world))
        assert all(layout.coords(r)[name] == i for g in groups for i, r in enumerate(g))


def test_two_d_rows_are_neighbours_and_columns_stride_by_q() -> None:
    layout = ParallelLayout.from_config({"tensor": {"size": 9, "mode": "2d"}}, 9)
    assert layout.group_ranks("tensor_row") == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert layout.group_ranks("tensor_col") == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    assert layout.size("tensor") == 9 and layout.group_ranks("tensor") == [list(range(9))]


def test_combined_groups_span_two_sub_dimensions() -> None:
    layout = ParallelLayout.from_config({"tensor": {"size": 8, "mode": "3d"}}, 8)
    assert layout.size("tensor_input_x_weight") == 4
    assert layout.group_ranks("tensor_input_x_weight") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert layout.group_ranks("tensor_output_x_weight") == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert ParallelLayout.from_config({"tensor": {"size": 8, "mode": "2.5d", "depth": 2}}, 8).group_ranks(
        "tensor_xz"
    ) == [[0, 2, 4, 6], [1, 3, 5, 7]]


def _colossal_groups(mode: str, q: int, d: int, tensor: int, world: int) -> dict[str, list[list[int]]]:
    """The rank lists Colossal-AI 0.2.8's process-group initializers build (their formulas, with
    ``h`` the tensor group's index; ``t = i + q·(j + q·k)`` inside a tensor group)."""
    h_range = range(world // tensor)
    r, a = range(q), range(d)
    if mode == "2d":
        return {
            "PARALLEL_2D_ROW": [[h * tensor + j * q + k for k in r] for h in h_range for j in r],
            "PARALLEL_2D_COL": [[h * tensor + j + k * q for k in r] for h in h_range for j in r],
        }
    if mode == "2.5d":
        at = lambda h, i, j, k: h * tensor + i + q * (j + q * k)  # noqa: E731
        return {
            "PARALLEL_2P5D_ROW": [[at(h, i, j, k) for i in r] for h in h_range for j in r for k in a],
            "PARALLEL_2P5D_COL": [[at(h, i, j, k) for j in r] for h in h_range for i in r for k in a],
            "PARALLEL_2P5D_DEP": [[at(h, i, j, k) for k in a] for h in h_range for i in r for j in r],
            "PARALLEL_2P5D_XZ": [[at(h, i, j, k) for k in a for j in r] for h in h_range for i in r],
        }
    at = lambda h, i, j, k: h * q**3 + i + q * (j + q * k)  # noqa: E731
    return {
        "PARALLEL_3D_INPUT": [[at(h, i, j, k) for j in r] for h in h_range for i in r for k in r],
        "PARALLEL_3D_WEIGHT": [[at(h, i, j, k) for i in r] for h in h_range for k in r for j in r],
        "PARALLEL_3D_OUTPUT": [[at(h, i, j, k) for k in r] for h in h_range for i in r for j in r],
        "PARALLEL_3D_INPUT_X_WEIGHT": [[at(h, i, j, k) for j in r for i in r] for h in h_range for k in r],
        "PARALLEL_3D_OUTPUT_X_WEIGHT": [[at(h, i, j, k) for k in r for i in r] for h in h_range for j in r],
    }


COLOSSAL_GROUP = {
    "PARALLEL_2D_ROW": "tensor_row", "PARALLEL_2D_COL": "tensor_col",
    "PARALLEL_2P5D_ROW": "tensor_row", "PARALLEL_2P5D_COL": "tensor_col", "PARALLEL_2P5D_DEP": "tensor_dep",
    "PARALLEL_2P5D_XZ": "tensor_xz",
    "PARALLEL_3D_INPUT": "tensor_input", "PARALLEL_3D_WEIGHT": "tensor_weight", "PARALLEL_3D_OUTPUT": "tensor_output",
    "PARALLEL_3D_INPUT_X_WEIGHT": "tensor_input_x_weight", "PARALLEL_3D_OUTPUT_X_WEIGHT": "tensor_output_x_weight",
}  # fmt: skip


@pytest.mark.parametrize(
    ("tensor", "q", "d"),
    [({"size": 4, "mode": "2d"}, 2, 1), ({"size": 9, "mode": "2d"}, 3, 1),
     ({"size": 8, "mode": "2.5d", "depth": 2}, 2, 2), ({"size": 18, "mode": "2.5d", "depth": 2}, 3, 2),
     ({"size": 8, "mode": "3d"}, 2, 1), ({"size": 27, "mode": "3d"}, 3, 1)],
)  # fmt: skip
def test_sub_dimension_groups_and_local_ranks_are_colossal_ais(tensor: dict, q: int, d: int) -> None:
    """Every group of every mode holds the ranks Colossal-AI's initializer puts in it, and a rank's
    coordinate in it is its index there (what ``gpc.get_local_rank(ParallelMode...)`` answers)."""
    world = tensor["size"] * 2
    layout = ParallelLayout.from_config({"tensor": tensor}, world)
    for mode_name, groups in _colossal_groups(tensor["mode"], q, d, tensor["size"], world).items():
        name = COLOSSAL_GROUP[mode_name]
        assert sorted(layout.group_ranks(name)) == sorted(groups), mode_name
        for group in groups:
            assert [layout.coords(rank)[name] for rank in group] == list(range(len(group))), mode_name


def test_expert_splits_data_with_the_expert_ranks_innermost() -> None:
    layout = ParallelLayout.from_config({"expert": 2, "tensor": 2}, 8)
    assert (layout.data, layout.expert) == (4, 2)
    assert layout.group_ranks("expert") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.group_ranks("expert_data") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.group_ranks("data") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert [layout.coords(r)["data"] for r in (0, 2, 4, 6)] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("parallel", "world", "message"),
    [
        ({"tensor": {"size": 6, "mode": "2d"}}, 6, "sizes that fit are 1, 4, 9, 16"),
        ({"tensor": {"size": 4, "mode": "3d"}}, 4, "sizes that fit are 1, 8, 27, 64"),
        ({"tensor": {"size": 6, "mode": "2.5d", "depth": 2}}, 6, "sizes that fit are 2, 8, 18, 32"),
        ({"tensor": {"size": 8, "mode": "2.5d"}}, 8, "needs parallel.tensor.depth"),
        ({"tensor": {"size": 4, "mode": "2d", "depth": 2}}, 4, "applies to mode='2.5d' only"),
        ({"expert": 3}, 4, "use one of [1, 2, 4]"),
        ({"context": 3}, 4, "does not fit the job's 4 process(es)"),
    ],
)
def test_layouts_that_do_not_fit_name_the_sizes_that_do(parallel: dict, world: int, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        ParallelLayout.from_config(parallel, world)


def test_unknown_group_names_the_groups_there_are() -> None:
    with pytest.raises(LaunchError, match="has no 'tensor_row' group; its groups are pipeline, data, context, tensor"):
        ParallelLayout(data=2).size("tensor_row")


def test_single_process_context_has_zero_coordinates_and_no_mesh() -> None:
    ember.launch(verbose=False)
    assert ember.context.coords == {"pipeline": 0, "data": 0, "context": 0, "tensor": 0}
    assert ember.context.mesh is None
    assert (ember.context.data_parallel_rank, ember.context.data_parallel_size) == (0, 1)


def test_zero_in_one_process_is_plain_training_with_the_users_optimizer() -> None:
    ds = tiny_dataset(64)
    runs = []
    for config in (None, {"zero": {"stage": 3}}):
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        engine, loader, _, _ = ember.initialize(model, opt, nn.CrossEntropyLoss(), DataLoader(ds, 16), config=config)
        assert engine.optimizer is opt
        for x, y in loader:
            engine.zero_grad()
            engine.backward(engine.criterion(engine(x), y))
            engine.step()
        runs.append(params_of(model))
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def test_ready_plans_name_the_projections() -> None:
    assert plans.mlp("0", "2") == {"0": "colwise", "2": "rowwise"}
    assert plans.attention(prefix="attn") == {
        "attn.q_proj": "colwise", "attn.k_proj": "colwise", "attn.v_proj": "colwise", "attn.out_proj": "rowwise",
    }  # fmt: skip
    block = plans.gpt_block(prefix="blocks.*")
    assert block["blocks.*.attn.out_proj"] == "rowwise" and block["blocks.*.mlp.fc1"] == "colwise"


def test_recognised_plan_equals_the_ready_plan_for_the_gpt_blocks() -> None:
    model = tiny_gpt()
    recognised = resolve_plan(model, None, 2)
    explicit = resolve_plan(model, plans.gpt_block(prefix="blocks.*"), 2)
    assert recognised == explicit
    assert sorted(recognised)[:2] == ["blocks.0.attn.k_proj", "blocks.0.attn.out_proj"]
    assert len(recognised) == 12 and "head" not in recognised
    assert resolve_plan(mlp(), None, 2) == {"0": "colwise", "2": "rowwise"}


def test_plan_accepts_torch_parallel_styles() -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    style = ColwiseParallel()
    resolved = resolve_plan(mlp(), {"0": style, "2": RowwiseParallel()}, 2)
    assert resolved["0"] is style


def test_rebuilt_optimizer_keeps_class_defaults_groups_and_the_scheduler_follows_it() -> None:
    model = mlp()
    names = parameter_names(model)
    old = adamw_groups(model)
    sched = torch.optim.lr_scheduler.SequentialLR(
        old,
        [torch.optim.lr_scheduler.ConstantLR(old, factor=0.5, total_iters=1), torch.optim.lr_scheduler.StepLR(old, 1)],
        milestones=[1],
    )
    new = rebuild_optimizer(old, model, names, "zero stage 3")
    assert type(new) is torch.optim.AdamW and new is not old
    assert [g["lr"] for g in new.param_groups] == [g["lr"] for g in old.param_groups] == [0.005, 0.0025]
    assert new.param_groups[1]["weight_decay"] == 0.0
    assert [len(g["params"]) for g in new.param_groups] == [2, 2]
    retarget_scheduler(sched, old, new)
    model(torch.randn(2, 8)).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "scheduler.step() before optimizer.step()" warning
        new.step()
        sched.step()
    assert [g["lr"] for g in new.param_groups] == [0.01, 0.005]
    assert [g["lr"] for g in old.param_groups] == [0.005, 0.0025]  # the old one is no longer driven


def test_the_users_optimizer_becomes_a_view_of_the_rebuilt_one() -> None:
    model = mlp()
    names = parameter_names(model)
    old = adamw_groups(model)
    sched = torch.optim.lr_scheduler.StepLR(old, step_size=1, gamma=0.5)  # built before the rebuild
    new = rebuild_optimizer(old, model, names, "zero stage 3")
    make_view(old, new)
    assert shares_param_groups(old, new) and old.state is new.state
    model(torch.randn(2, 8)).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # new.step() counts as old's step for the scheduler's order check
        new.step()
        sched.step()
    assert [g["lr"] for g in new.param_groups] == [0.005, 0.0025]  # the scheduler sets the stepping rates
    before = params_of(model)
    model(torch.randn(2, 8)).sum().backward()
    old.step()  # steps the rebuilt optimizer: one optimizer, one state
    assert len(new.state) == 4 and old.state_dict()["state"].keys() == new.state_dict()["state"].keys()
    assert any(not torch.equal(a, b) for a, b in zip(before, params_of(model), strict=True))


def test_make_resumable_reshards_a_loader_built_for_another_data_parallel_size() -> None:
    ds = tiny_dataset(16)
    loader = DataLoader(ds, batch_size=4, sampler=ResumableSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3))
    same = make_resumable(loader, num_replicas=2, rank=1)
    assert same is loader
    whole = make_resumable(loader, num_replicas=1, rank=0)
    assert (whole.sampler.num_replicas, whole.sampler.rank, whole.sampler.seed) == (1, 0, 3)
    assert whole.sampler.shuffle and len(list(whole.sampler)) == 16
