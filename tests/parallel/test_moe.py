"""The MoE layer in one process: routing equals a token-by-token loop, the balance loss reaches the
loss, the Trainer logs it and the dropped tokens, and bad input is one clear error.

Expert parallelism on several ranks is compared with one process in ``test_moe_equivalence.py``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

import ember
from ember.config import load_config
from ember.errors import ConfigError, EngineError
from ember.layout import ParallelLayout
from ember.parallel import moe as moe_module
from ember.parallel.moe import MoE, MoEStats, Router, is_expert
from ember.parallel.strategy import check_parallel
from ember.trainer import Trainer

DIM, EXPERTS = 6, 4


def expert() -> nn.Module:
    return nn.Sequential(nn.Linear(DIM, 10), nn.GELU(), nn.Linear(10, DIM))


def layer(router: Router, **kwargs: Any) -> MoE:
    torch.manual_seed(0)
    return MoE(DIM, EXPERTS, expert, router, **kwargs)


def token_by_token(moe: MoE, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """GShard's rule written out: first choices claim slots in token order, then second choices."""
    tokens = x.reshape(-1, DIM)
    probs = torch.softmax(tokens @ moe.gate.weight.t(), dim=-1)
    router = moe.router
    choices = torch.topk(probs, router.k, dim=-1).indices
    capacity = router.capacity(tokens.shape[0], EXPERTS)
    taken = [0] * EXPERTS
    kept = torch.zeros_like(choices, dtype=torch.bool)
    for c in range(router.k):
        for t in range(tokens.shape[0]):
            e = int(choices[t, c])
            if taken[e] < capacity:
                kept[t, c], taken[e] = True, taken[e] + 1
    weights = probs.gather(1, choices)
    if router.normalize:
        weights = weights / weights.sum(-1, keepdim=True)
    rows = []
    for t in range(tokens.shape[0]):
        row = torch.zeros(DIM)
        for c in range(router.k):
            if kept[t, c]:
                row = row + weights[t, c] * moe.experts[str(int(choices[t, c]))](tokens[t : t + 1])[0]
        rows.append(row)
    return torch.stack(rows).view(x.shape), int((~kept).sum())


@pytest.mark.parametrize(("k", "factor"), [(1, 4.0), (1, 0.5), (2, 2.0), (2, 0.5)])
def test_the_layer_equals_a_token_by_token_loop_forward_and_backward(k: int, factor: float) -> None:
    moe = layer(Router(k=k, capacity_factor=factor, min_capacity=1))
    x = torch.randn(3, 8, DIM, requires_grad=True)
    out = moe(x)
    grads = torch.autograd.grad(out.square().sum(), [x, *moe.parameters()])
    ref, dropped = token_by_token(moe, x)
    ref_grads = torch.autograd.grad(ref.square().sum(), [x, *moe.parameters()])
    assert torch.allclose(out, ref, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads, ref_grads, strict=True))
    assert int((~moe.last_assignment.kept).sum()) == dropped
    assert (dropped > 0) == (factor < 1)  # a tight capacity drops, room for every token does not


def test_capacity_and_evaluation_without_drops() -> None:
    router = Router(k=2, capacity_factor=1.25, eval_capacity_factor=2.0, min_capacity=3, drop_tokens=False)
    assert router.capacity(tokens=10, experts=4) == math.ceil(2 * 1.25 * 10 / 4)
    assert router.capacity(tokens=2, experts=4) == 3  # min_capacity
    moe = layer(router)
    moe.eval()
    with torch.no_grad():
        moe(torch.randn(40, DIM))
    assert bool(moe.last_assignment.kept.all())  # evaluation without drop_tokens: room for every choice


def test_noise_changes_training_routing_only() -> None:
    x = torch.randn(64, DIM)
    for noise in ("jitter", "gaussian", lambda logits: logits * 0):
        moe = layer(Router(noise=noise, noise_eps=0.5, capacity_factor=8.0))
        plain = layer(Router(capacity_factor=8.0))
        moe.eval(), plain.eval()
        assert torch.equal(moe(x), plain(x))
        moe.train()
        with torch.no_grad():
            assert not torch.equal(moe(x), plain(x))


def test_the_engine_adds_the_weighted_balance_loss_and_publishes_it() -> None:
    weight = 0.5
    moe, ref = layer(Router(k=2), aux_loss_weight=weight), layer(Router(k=2), aux_loss_weight=weight)
    x, target = torch.randn(16, DIM), torch.randn(16, DIM)
    out = ref(x)
    probs = torch.softmax(x @ ref.gate.weight.t(), dim=-1)
    first = nn.functional.one_hot(probs.argmax(-1), EXPERTS).float()
    balance = EXPERTS * (first.mean(0) * probs.mean(0)).sum()  # Switch Transformer's loss
    assert torch.allclose(ref.aux_loss, balance)
    (nn.functional.mse_loss(out, target) + weight * balance).backward()
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    engine, *_ = ember.initialize(moe, torch.optim.SGD(moe.parameters(), lr=0.1), nn.MSELoss())
    engine.zero_grad()
    engine.backward(engine.criterion(engine(x), target))
    engine.step()
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(moe.parameters(), ref.parameters(), strict=True))
    assert torch.allclose(engine.step_scalars["moe/aux_loss"], weight * balance)
    dropped = int((~moe.last_assignment.kept).sum())
    assert float(engine.step_scalars["moe/dropped_fraction"]) == pytest.approx(dropped / (2 * 16))


def test_the_trainer_logs_the_balance_loss_and_the_dropped_fraction() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.moe = nn.Linear(3, DIM), layer(Router(capacity_factor=0.5, min_capacity=1))
            self.head = nn.Linear(DIM, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.embed(x)
            return self.head(h + self.moe(h))

    model = Net()
    data = torch.utils.data.TensorDataset(torch.randn(32, 3), torch.randint(0, 2, (32,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    engine, loader, *_ = ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                          nn.CrossEntropyLoss(), loader)  # fmt: skip
    trainer = Trainer(engine)
    trainer.fit(loader, epochs=1)
    steps = trainer.storage.values("moe/dropped_fraction")
    assert [s for s, _ in steps] == [1, 2, 3, 4] and all(0 < f < 1 for _, f in steps)
    assert len(trainer.storage.values("moe/aux_loss")) == 4


def test_a_forward_that_is_not_back_propagated_leaves_nothing_behind() -> None:
    moe = layer(Router())
    stats = MoEStats.of(nn.Sequential(moe))
    assert stats is not None and MoEStats.of(nn.Linear(2, 2)) is None
    moe(torch.randn(4, DIM))
    with torch.no_grad():
        moe(torch.randn(4, DIM))  # evaluation records nothing
    loss, scalars = stats.pop()
    assert loss is not None and set(scalars) == {"moe/aux_loss", "moe/dropped_fraction"}
    assert stats.pop() == (None, {})


def test_uncollected_balance_losses_are_refused_past_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(moe_module, "MAX_PENDING", 3)
    moe, counts_only = layer(Router()), layer(Router(), aux_loss_weight=0)
    for _ in range(3):
        moe(torch.randn(4, DIM))
    with pytest.raises(EngineError, match=r"losses of 3 training forwards were never collected.*engine.backward"):
        moe(torch.randn(4, DIM))  # each kept loss holds its forward's graph: no unbounded growth
    for _ in range(5):
        counts_only(torch.randn(4, DIM))  # counts alone: the oldest are dropped
    assert len(counts_only.pop_auxiliary()[1]) == 3


def test_a_non_finite_gate_logit_is_an_error_naming_it() -> None:
    moe = layer(Router())
    x = torch.randn(4, DIM)
    x[2, 1] = float("nan")
    with pytest.raises(EngineError, match=r"non-finite logits.*lower the learning rate"):
        moe(x)
    with pytest.raises(EngineError, match=r"MoE\(d_model=6\) takes floating-point tokens \[..., 6\], got .* \(4, 5\)"):
        moe(torch.randn(4, 5))
    with pytest.raises(EngineError, match=r"got a torch.int64 tensor"):
        moe(torch.ones(4, 6, dtype=torch.long))


def test_bad_router_and_expert_counts_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"1 \(Switch\) or 2 \(GShard\)"):
        Router(k=3)
    with pytest.raises(ConfigError, match="capacity_factor=0"):
        Router(capacity_factor=0)
    with pytest.raises(ConfigError, match="noise='uniform'"):
        Router(noise="uniform")
    with pytest.raises(ConfigError, match=r"MoE\(router='top2'\) must be an ember.parallel.moe.Router"):
        MoE(DIM, 2, expert, "top2")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"built a int, not an nn.Module"):
        MoE(DIM, 2, lambda: 5)  # type: ignore[arg-type, return-value]
    with pytest.raises(ConfigError, match=r"3 experts cannot be split evenly over parallel.expert=2.*2, 4, 6"):
        MoE(DIM, 3, expert, layout=ParallelLayout(data=2, expert=2))
    assert all(is_expert(p) for p in layer(Router()).experts.parameters())
    assert not is_expert(layer(Router()).gate.weight)


def _check(parallel: dict[str, Any], world: int, model: nn.Module, **more: Any) -> Any:
    cfg = load_config({"parallel": parallel, **more})
    return check_parallel(cfg, model, torch.optim.SGD(model.parameters(), lr=0.1), world)


def test_expert_parallel_settings_that_cannot_run_are_refused_before_any_collective() -> None:
    plain = nn.Sequential(nn.Linear(DIM, DIM))
    with pytest.raises(ConfigError, match=r"parallel.expert=2 but the model has no ember MoE layer"):
        _check({"expert": 2}, 2, plain)
    moe = nn.Sequential(layer(Router()))  # built without a launch: for parallel.expert=1
    with pytest.raises(ConfigError, match=r"built for parallel.expert=1.*has parallel.expert=2.*after ember.launch"):
        _check({"expert": 2}, 2, moe)
    with pytest.raises(ConfigError, match=r"parallel.expert=2 cannot be combined with parallel.tensor.size=2"):
        _check({"expert": 2, "tensor": 2}, 4, moe, zero={"stage": 2})
    with pytest.raises(ConfigError, match=r"parallel.expert=2 cannot be combined with zero.stage=1"):
        _check({"expert": 2}, 2, moe, zero=1)
    with pytest.raises(ConfigError, match=r"parallel.expert=3 does not divide the 2 data-parallel replicas"):
        _check({"expert": 3, "data": 2}, 2, moe)
    assert _check({"expert": 1}, 2, moe).layout.expert == 1  # MoE layers under plain data parallelism
    assert load_config({"max_ep_size": 2}).parallel.expert == 2  # Colossal-AI's names for it
    assert load_config({"parallel": {"moe": {"size": 4}}}).parallel.expert == 4
    handlers = load_config({"gradient_handler": [{"type": "MoeGradientHandler"}]}).gradient_handler
    assert handlers == []  # Colossal-AI's MoE gradient handler is what the expert-parallel policy does
