"""Master weights (``master_weights=True``): fp16/bf16 parameters, fp32 masters, the dynamic loss scale.

Proof by comparison: 200 updates against an fp32 hand loop (the tolerance each dtype stays
within is stated below), and an interrupted run resumed from ``engine.state_dict()`` equal to
an uninterrupted one bit for bit. The ZeRO-1 (sharded masters) and expert-parallel cases are in
``tests/parallel/test_moe_equivalence.py``.
"""

from __future__ import annotations

import copy
import enum
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ember
from ember import checkpoint
from ember.amp import LossScale, MasterWeights
from ember.config import load_config
from ember.errors import ConfigError, EngineError, NonFiniteLossError

# After 200 updates of SGD with momentum and clipping: the largest parameter difference from the
# fp32 hand loop and the largest difference of a step's loss (measured: fp16 1.9e-4 and 8e-5,
# bf16 1.4e-3 and 7.2e-4; the bounds allow 5x that).
TOLERANCE = {"fp16": (1e-3, 4e-4), "bf16": (7e-3, 4e-3)}


class AmpType(enum.Enum):  # Colossal-AI's AMP_TYPE, for the config's fp16 key
    TORCH = "torch"
    NAIVE = "naive"
    APEX = "apex"


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


def data(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(steps, 16, 10, generator=g), torch.randint(0, 4, (steps, 16), generator=g)


def engine_for(amp: str, **config: Any) -> Any:
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return ember.initialize(model, opt, nn.CrossEntropyLoss(), config={"amp": amp, "master_weights": True, **config})[0]


def train(engine: Any, xs: torch.Tensor, ys: torch.Tensor) -> list[float]:
    losses = []
    for x, y in zip(xs, ys, strict=True):
        engine.zero_grad()
        loss = engine.criterion(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_200_updates_stay_within_the_stated_tolerance_of_an_fp32_hand_loop(amp: str) -> None:
    xs, ys = data(200)
    ref = net()
    opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    ref_losses = []
    for x, y in zip(xs, ys, strict=True):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ref(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        opt.step()
        ref_losses.append(loss.item())
    engine = engine_for(amp, clip_grad_norm=1.0)
    losses = train(engine, xs, ys)
    params, loss_tol = TOLERANCE[amp]
    saved = engine.state_dict()["model"]
    assert {v.dtype for v in saved.values()} == {torch.float32}  # the masters are what is saved
    assert max(float((saved[k] - v).abs().max()) for k, v in ref.state_dict().items()) <= params
    assert max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True)) <= loss_tol
    assert engine.skipped_updates == 0


def test_parameters_and_gradients_are_low_precision_and_the_optimizer_steps_fp32_masters() -> None:
    engine = engine_for("fp16")
    x, y = data(1)
    engine.zero_grad()
    engine.backward(engine.criterion(engine(x[0]), y[0]))
    assert {p.dtype for p in engine.model.parameters()} == {torch.float16}
    assert {p.grad.dtype for p in engine.model.parameters()} == {torch.float16}  # half the gradient memory
    masters = [p for g in engine.optimizer.param_groups for p in g["params"]]
    assert {p.dtype for p in masters} == {torch.float32} and len(masters) == 6
    assert engine.step()
    for p, m in zip(engine.model.parameters(), masters, strict=True):
        assert torch.equal(p, m.half()) and p.grad is None and m.grad is None  # nothing kept between updates


def test_accumulation_equals_one_big_batch_within_fp16_tolerance() -> None:
    xs, ys = data(8)
    one = engine_for("fp16")
    two = engine_for("fp16", gradient_accumulation=2)
    for step in range(4):
        big_x, big_y = torch.cat(list(xs[2 * step : 2 * step + 2])), torch.cat(list(ys[2 * step : 2 * step + 2]))
        one.zero_grad()
        one.backward(one.criterion(one(big_x), big_y))
        assert one.step()
        for k in range(2):
            two.zero_grad()
            two.backward(two.criterion(two(xs[2 * step + k]), ys[2 * step + k]))
            assert two.step() == (k == 1)
    a, b = one.state_dict()["model"], two.state_dict()["model"]
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-3


def test_a_run_resumed_from_its_state_is_bit_identical(tmp_path: Path) -> None:
    xs, ys = data(60)
    config = {"clip_grad_norm": 1.0, "gradient_accumulation": 2, "grad_scaler": {"growth_interval": 5}}
    whole = engine_for("fp16", **config)
    train(whole, xs, ys)
    first = engine_for("fp16", **config)
    train(first, xs[:31], ys[:31])  # stopped inside an accumulation cycle: the partial fp16 gradients go along
    torch.save(first.state_dict(), tmp_path / "engine.pt")
    resumed = engine_for("fp16", **config)
    resumed.load_state_dict(torch.load(tmp_path / "engine.pt", weights_only=True))
    train(resumed, xs[31:], ys[31:])
    a, b = whole.state_dict(), resumed.state_dict()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert all(torch.equal(p, q) for p, q in zip(whole.model.parameters(), resumed.model.parameters(), strict=True))
    assert a["precision"] == b["precision"] and a["precision"]["loss_scale"]["scale"] > 2.0**16  # it grew
    checkpoint.save_model(tmp_path / "weights.pt", resumed)
    weights = torch.load(tmp_path / "weights.pt", weights_only=True)
    plain = net()
    plain.load_state_dict(weights)  # the fp32 masters load into an fp32 model as they are
    assert all(torch.equal(weights[k], b["model"][k]) for k in weights)


def test_an_overflow_skips_the_update_backs_the_scale_off_and_is_counted() -> None:
    engine = engine_for("fp16", grad_scaler={"init_scale": 2.0**30, "max_scale": 2.0**30, "hysteresis": 2})
    xs, ys = data(4)
    before = copy.deepcopy(engine.state_dict()["model"])
    engine.zero_grad()
    engine.backward(engine.criterion(engine(xs[0]) * 1e4, ys[0]))  # fp16 gradients overflow at 2**30
    assert not engine.step() and engine.last_step_skipped and engine.skipped_updates == 1
    assert engine.precision.loss_scale == 2.0**30  # hysteresis 2: the first overflow is tolerated
    engine.zero_grad()
    engine.backward(engine.criterion(engine(xs[1]) * 1e4, ys[1]))
    assert not engine.step() and engine.precision.loss_scale == 2.0**29
    after = engine.state_dict()["model"]
    assert all(torch.equal(before[k], after[k]) for k in before)  # skipped updates change nothing
    assert engine.state_dict()["skipped_updates"] == 2


def test_a_collapsing_loss_scale_is_an_error_not_a_run_that_skips_every_update() -> None:
    engine = engine_for("fp16", grad_scaler={"init_scale": 4.0, "min_scale": 1.0})
    x, y = data(1)
    with pytest.raises(NonFiniteLossError, match=r"loss scale collapsed.*minimum loss scale 1\b.*amp='bf16'"):
        for _ in range(5):
            engine.zero_grad()
            out = engine(x[0])
            out.register_hook(lambda grad: grad * float("inf"))  # a finite loss, gradients that are not
            engine.backward(engine.criterion(out, y[0]))
            engine.step()
    assert engine.precision.loss_scale == 1.0 and engine.skipped_updates == 2


def test_loss_scale_grows_after_a_clean_run_up_to_its_maximum() -> None:
    scale = LossScale(init_scale=8.0, growth_interval=2, max_scale=20.0, hysteresis=2)
    for _ in range(4):
        scale.update(False)
    assert scale.scale == 20.0
    scale.update(True)
    assert scale.scale == 20.0 and scale.overflows == 1
    scale.update(True)
    assert scale.scale == 10.0
    scale.update(True)  # until the scale grows again, every overflow backs off
    assert scale.scale == 5.0
    copy_ = LossScale(init_scale=8.0)
    copy_.load_state_dict(scale.state_dict())
    assert copy_.state_dict() == scale.state_dict()
    with pytest.raises(ConfigError, match="min_scale <= init_scale"):
        LossScale(init_scale=0.5, min_scale=1.0)
    with pytest.raises(EngineError, match=r"is not a LossScale state.*master_weights=True fp16 run"):
        copy_.load_state_dict({"scale": "big"})  # a damaged checkpoint's precision state


def test_master_weights_config_and_colossal_naive_amp() -> None:
    cfg = load_config({"fp16": {"mode": AmpType.NAIVE, "initial_scale": 2**20, "hysteresis": 2, "max_scale": 2**24,
                                "min_scale": 1, "clip_grad_norm": 1.0, "verbose": True}})  # fmt: skip
    assert (cfg.amp, cfg.master_weights, cfg.clip_grad_norm) == ("fp16", True, 1.0)
    assert cfg.grad_scaler == {"init_scale": 2.0**20, "hysteresis": 2, "max_scale": 2.0**24, "min_scale": 1.0}
    assert isinstance(engine_for(cfg.amp, grad_scaler=dict(cfg.grad_scaler)).precision, MasterWeights)
    refused = [
        ({"amp": None, "master_weights": True}, "needs amp='fp16' or amp='bf16'"),
        ({"amp": "fp16", "grad_scaler": {"hysteresis": 2}}, "grad_scaler.hysteresis applies to master_weights"),
        ({"amp": "fp16", "master_weights": True, "zero": {"stage": 3}}, "zero.stage=3.*mixed_precision='bf16'"),
    ]
    for config, message in refused:
        model = net()
        with pytest.raises(ConfigError, match=message):
            ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), config=config)
    for fp16, message in [
        (True, "'fp16' got True.*fp16=dict\\(mode='naive'\\).*master_weights=True"),
        ({"mode": AmpType.APEX}, "'apex'.*mode='torch'.*mode='naive'.*apex is not a dependency"),
        ({"mode": AmpType.NAIVE, "log_num_zeros_in_grad": True}, "log_num_zeros_in_grad=True' has no ember"),
        ({"mode": AmpType.NAIVE, "dynamic_grad_scale": False}, "constant loss scale"),
        ({"mode": AmpType.TORCH, "hysteresis": 2}, "'fp16.hysteresis' is not an ember setting"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config({"fp16": fp16})
    with pytest.raises(ConfigError, match="'fp16' and 'clip_grad_norm' disagree"):
        load_config({"fp16": {"mode": AmpType.NAIVE, "clip_grad_norm": 1.0}, "clip_grad_norm": 2.0})


def test_sharded_checkpoints_are_refused_with_masters_in_the_optimizer() -> None:
    engine = engine_for("bf16")
    with pytest.raises(EngineError, match=r"cannot be saved or loaded under one process with master_weights"):
        engine.parallel.sharded_state_dicts(engine.model, engine.optimizer)


def test_master_weights_need_an_optimizer_that_has_not_stepped() -> None:
    model = net()
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 10)).sum().backward()
    opt.step()
    with pytest.raises(EngineError, match="has not stepped yet"):
        ember.initialize(model, opt, config={"amp": "bf16", "master_weights": True})
