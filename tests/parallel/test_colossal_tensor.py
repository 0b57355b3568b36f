"""Colossal-AI's tensor-parallel names on ember, in one process: ``colossalai.nn`` dispatch, the
mode classes under Colossal-AI's module paths, ``gpc`` for the tensor modes, ``PipelinableContext``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import ember.compat.colossalai as colossalai
import ember.compat.colossalai.nn as col_nn
from ember import context
from ember.compat.colossalai.context import ParallelMode
from ember.compat.colossalai.core import global_context as gpc
from ember.compat.colossalai.nn.layer import parallel_1d, parallel_2d, parallel_2p5d, parallel_3d
from ember.compat.colossalai.pipeline import PipelinableContext, PipelinableModel
from ember.errors import ConfigError, ContextError
from ember.parallel.grid import reset_grids
from tests.parallel.vit import ViT, images


@pytest.fixture
def launched() -> Any:
    def launch(tensor: dict[str, Any] | None) -> None:
        colossalai.launch(config={"parallel": {"tensor": tensor}} if tensor else {}, rank=0, world_size=1,
                          host="127.0.0.1", port=0, backend="gloo", verbose=False)  # fmt: skip

    reset_grids()
    yield launch
    context.reset()
    reset_grids()


@pytest.mark.parametrize(
    ("tensor", "linear", "norm", "loss"),
    [
        (None, nn.Linear, nn.LayerNorm, nn.CrossEntropyLoss),
        ({"size": 1, "mode": "1d"}, parallel_1d.Linear1D_Col, parallel_1d.LayerNorm1D, nn.CrossEntropyLoss),
        ({"size": 1, "mode": "2d"}, parallel_2d.Linear2D, parallel_2d.LayerNorm2D, col_nn.CrossEntropyLoss2D),
        ({"size": 1, "mode": "2.5d", "depth": 1}, parallel_2p5d.Linear2p5D, parallel_2p5d.LayerNorm2p5D,
         col_nn.CrossEntropyLoss2p5D),
        ({"size": 1, "mode": "3d"}, parallel_3d.Linear3D, parallel_3d.LayerNorm3D, col_nn.CrossEntropyLoss3D),
    ],
)  # fmt: skip
def test_colossalai_nn_builds_the_launched_modes_layers(launched: Any, tensor: Any, linear: type, norm: type,
                                                       loss: type) -> None:  # fmt: skip
    launched(tensor)
    assert type(col_nn.Linear(8, 8)) is linear and type(col_nn.LayerNorm(8)) is norm
    assert type(col_nn.CrossEntropyLoss()) is loss
    model = ViT(col_nn)  # the whole ViT from Colossal-AI's names: its keys are the plain model's
    x, _ = images(2).tensors
    assert model(x).shape == (2, 4)


def test_vocab_parallel_layers_above_the_limit_switch_the_loss(launched: Any) -> None:
    launched({"size": 1, "mode": "2d"})
    assert type(col_nn.Classifier(8, 10)).__name__ == "Classifier2D"
    assert type(col_nn.CrossEntropyLoss()).__name__ == "CrossEntropyLoss2D"
    assert type(col_nn.Classifier(8, 4096)).__name__ == "VocabParallelClassifier2D"
    assert type(col_nn.Embedding(3000, 8)).__name__ == "VocabParallelEmbedding2D"
    assert type(col_nn.CrossEntropyLoss()).__name__ == "VocabParallelCrossEntropyLoss2D"


def test_a_colossalai_nn_layer_before_launch_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"built before colossalai\.launch"):
        col_nn.Linear(8, 8)


def test_gpc_answers_the_launched_tensor_modes_groups(launched: Any) -> None:
    launched({"size": 1, "mode": "3d"})
    for mode in ("INPUT", "WEIGHT", "OUTPUT", "INPUT_X_WEIGHT", "OUTPUT_X_WEIGHT"):
        member = ParallelMode[f"PARALLEL_3D_{mode}"]
        assert gpc.is_initialized(member) and gpc.get_local_rank(member) == 0 and gpc.get_world_size(member) == 1
        assert gpc.get_group(member) is None
    assert not gpc.is_initialized(ParallelMode.PARALLEL_2D_ROW) and not gpc.is_initialized(ParallelMode.PARALLEL_1D)
    with pytest.raises(ContextError, match=r"parallel\.tensor\.mode='3d'"):
        gpc.get_local_rank(ParallelMode.PARALLEL_2D_ROW)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.blocks = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x)))


def _pipelinable() -> tuple[PipelinableContext, Net]:
    ctx = PipelinableContext()
    state = torch.get_rng_state()
    with ctx:
        model = Net()
    assert torch.equal(torch.get_rng_state(), state)  # the context leaves the generator as it found it
    return ctx, model


@pytest.mark.parametrize(
    ("policy", "points"),
    [
        ("uniform", ["_module_list.2"]),
        ("balanced", ["_module_list.2"]),
        ({0: [(0, 1)], 1: [(1, 5)]}, ["_module_list.1"]),
    ],
)  # fmt: skip
def test_pipelinable_context_splits_the_model_it_saw_built(policy: Any, points: list[str]) -> None:
    ctx, model = _pipelinable()
    ctx.to_layer_list()
    ctx.policy = policy
    split = ctx.partition(1, 2, 0)
    assert isinstance(split, PipelinableModel) and list(split.pipeline_split_points) == points
    assert ctx.layers_count == 5  # embed, the Sequential's three, head
    x = torch.randn(3, 4)
    assert torch.equal(split(x), model(x))


def test_pipelinable_context_takes_an_exec_seq_with_functions_and_split_nodes() -> None:
    ctx, model = _pipelinable()
    ctx.to_layer_list(["embed", (lambda x: x * 2, "behind"), "SPLIT_NODE", "blocks", "head"])
    ctx.policy = "customized"
    split = ctx.partition(1, 2, 1)
    assert split.pipeline_split_points == ("_module_list.2",) and ctx.funcs_count == 1
    x = torch.randn(3, 4)
    assert torch.allclose(split(x), model.head(model.blocks(model.embed(x) * 2)))


@pytest.mark.parametrize(
    ("setup", "culprit"),
    [
        (lambda c: c.partition(2, 2, 0), "num_chunks=2"),
        (lambda c: (c.to_layer_list(["embed", "head"]), setattr(c, "policy", "customized"), c.partition(1, 2, 0)),
         "found 0 SPLIT_NODE"),
        (lambda c: (setattr(c, "policy", {0: [(0, 2)], 1: [(3, 5)]}), c.partition(1, 2, 0)), "contiguously"),
        (lambda c: c.to_layer_list(["embedd"]), "'embedd' is not a module"),
        (lambda c: (setattr(c, "policy", "round-robin"), c.partition(1, 2, 0)), "'round-robin'"),
    ],
)  # fmt: skip
def test_bad_pipelinable_settings_are_config_errors(setup: Any, culprit: str) -> None:
    ctx, _ = _pipelinable()
    with pytest.raises(ConfigError, match=culprit.replace("(", r"\(").replace("[", r"\[")):
        setup(ctx)


def test_pipelinable_context_with_no_model_built_says_so() -> None:
    with PipelinableContext() as ctx:
        pass
    with pytest.raises(ConfigError, match="exactly one model"):
        ctx.to_layer_list()
