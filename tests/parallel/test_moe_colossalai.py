"""Colossal-AI's MoE names on ember: ``MOE_CONTEXT``, ``colossalai.nn.layer.moe``, ``MoeLoss``.

A program written as Colossal-AI's MoE example is (``MOE_CONTEXT.setup``, layers returning
``(output, l_aux)``, ``MOE_CONTEXT.add_loss``, ``MoeLoss``) trains through ``colossalai.initialize``
and the Trainer in one process; the routers keep Colossal-AI's capacity rule and Top-2 loss.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

import ember.compat.colossalai as colossalai
from ember.compat.colossalai.context import MOE_CONTEXT
from ember.compat.colossalai.nn.layer.moe import (
    Experts,
    FFNExperts,
    MoeLayer,
    MoeModule,
    NormalNoiseGenerator,
    Top1Router,
    Top2Router,
    TPExperts,
    UniformNoiseGenerator,
    build_ffn_experts,
)
from ember.compat.colossalai.nn.loss import MoeCrossEntropyLoss, MoeLoss
from ember.compat.colossalai.trainer import Trainer
from ember.errors import ConfigError, ContextError, EngineError

DIM = 8


def _launch(**config: Any) -> None:
    colossalai.launch(config=config, rank=0, world_size=1, host="127.0.0.1", port=29500, backend="gloo",
                      verbose=False)  # fmt: skip


class Widenet(nn.Module):
    """Colossal-AI's example shape: the model adds each layer's l_aux to MOE_CONTEXT."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, DIM)
        router = Top2Router(capacity_factor_train=1.0, noisy_func=NormalNoiseGenerator(4))
        self.ffn = MoeLayer(DIM, 4, router, Experts(nn.Linear, 4, in_features=DIM, out_features=DIM))
        self.head = nn.Linear(DIM, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        MOE_CONTEXT.reset_loss()
        h = self.embed(x)
        out, l_aux = self.ffn(h)
        MOE_CONTEXT.add_loss(l_aux)
        return self.head(h + out)


def test_a_colossal_moe_program_trains_with_moe_loss_and_logs_the_dropped_tokens() -> None:
    with pytest.raises(ContextError, match="needs a launch first"):
        MOE_CONTEXT.setup(42)
    _launch(max_ep_size=1, BATCH_SIZE=8)
    MOE_CONTEXT.setup(42)
    assert MOE_CONTEXT.is_initialized and (MOE_CONTEXT.max_ep_size, MOE_CONTEXT.min_dp_size) == (1, 1)
    with pytest.raises(ContextError, match="called twice"):
        MOE_CONTEXT.setup(42)
    model = Widenet()
    criterion = MoeLoss(aux_weight=0.01, loss_fn=nn.CrossEntropyLoss, label_smoothing=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    engine, loader, _, _ = colossalai.initialize(model, torch.optim.Adam(model.parameters(), lr=1e-2), criterion,
                                                 loader)  # fmt: skip
    x, y = next(iter(loader))
    out = engine(x)
    expected = nn.functional.cross_entropy(out, y, label_smoothing=0.1) + 0.01 * MOE_CONTEXT.get_loss()
    assert torch.equal(engine.criterion(out, y), expected)
    trainer = Trainer(engine=engine)
    trainer.fit(train_dataloader=loader, epochs=1)
    assert len(trainer.storage.values("moe/dropped_fraction")) == 4
    with pytest.raises(KeyError):  # the aux loss went through MoeLoss once, not also through the Engine
        trainer.storage.values("moe/aux_loss")
    assert all(p.moe_info.ep_size == 1 for p in model.ffn.experts.parameters())


def test_routers_keep_colossal_ais_capacity_rule_and_top2_loss() -> None:
    top1, top2 = Top1Router(capacity_factor_train=1.25, min_capacity=2), Top2Router(capacity_factor_train=1.0)
    assert top1.capacity(tokens=10, experts=4) == 4  # floor(1.25 * 10 / 4) = 3, rounded up to even
    assert top2.capacity(tokens=10, experts=4) == 6  # floor(2 * 10 / 4) = 5 -> 6
    top1.eval()
    assert top1.capacity(tokens=10, experts=4) == 6  # capacity_factor_eval=2.0
    probs = torch.softmax(torch.randn(12, 4), dim=-1)
    choices = torch.topk(probs, 2).indices
    both = nn.functional.one_hot(choices, 4).sum(1).float()
    assert torch.allclose(top2.balance_loss(probs, choices), 4 * (both.mean(0) * probs.mean(0)).sum() / 2)
    assert not top2.normalize and top2.k_value == 2  # gate weights are the probabilities, as there
    with pytest.raises(ConfigError, match="select_policy='random'"):
        Top1Router(select_policy="random")
    noisy = UniformNoiseGenerator(0.1)(torch.ones(100))
    assert float(noisy.min()) >= 0.9 and float(noisy.max()) <= 1.1


def test_moe_module_with_a_residual_expert_and_the_ffn_experts() -> None:
    torch.manual_seed(0)
    moe = MoeModule(DIM, 4, top_k=2, noisy_policy="Jitter", use_residual=True, expert_cls=nn.Linear,
                    in_features=DIM, out_features=DIM)  # fmt: skip
    out, l_aux = moe(torch.randn(2, 5, DIM))
    assert out.shape == (2, 5, DIM) and l_aux.dim() == 0
    experts = build_ffn_experts(4, d_model=DIM, d_ff=16, drop_rate=0.1)
    assert isinstance(experts, FFNExperts) and experts.num_local_experts == 4
    layer = MoeLayer(DIM, 4, Top1Router(), experts)
    out, _ = layer(torch.randn(6, DIM))
    assert out.shape == (6, DIM)
    with pytest.raises(EngineError, match=r"TPExperts .* is not provided"):
        TPExperts(4, DIM, 16)
    with pytest.raises(ConfigError, match="noisy_policy='Uniform'"):
        MoeModule(DIM, 4, noisy_policy="Uniform", expert_cls=nn.Linear, in_features=DIM, out_features=DIM)
    loss = MoeCrossEntropyLoss(aux_weight=0.5)
    MOE_CONTEXT.reset_loss()
    MOE_CONTEXT.add_loss(torch.tensor(2.0))
    logits, target = torch.randn(3, 4), torch.tensor([0, 1, 2])
    assert math.isclose(float(loss(logits, target)), float(nn.functional.cross_entropy(logits, target)) + 1.0,
                        rel_tol=1e-6)  # fmt: skip
