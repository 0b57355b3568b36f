"""The Engine against hand-written PyTorch loops: identity, accumulation, clipping, AMP."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import ember
import ember.engine
from tests.models import params_of, tiny_dataset, tiny_mlp


def _hand_loop(model: nn.Module, loader: DataLoader, steps: int, lr: float = 0.1) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    it = iter(loader)
    for _ in range(steps):
        x, y = next(it)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _engine_loop(engine: ember.Engine, loader: DataLoader, steps: int) -> list[float]:
    losses = []
    it = iter(loader)
    for _ in range(steps):
        x, y = next(it)
        engine.zero_grad()
        loss = engine.criterion(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def test_engine_loop_is_bit_identical_to_hand_loop() -> None:
    ds = tiny_dataset(50 * 8)
    hand = tiny_mlp()
    hand_losses = _hand_loop(hand, DataLoader(ds, batch_size=8), 50)

    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    engine, loader, _, _ = ember.initialize(model, opt, nn.CrossEntropyLoss(), DataLoader(ds, batch_size=8))
    assert _engine_loop(engine, loader, 50) == hand_losses
    for a, b in zip(params_of(hand), params_of(model), strict=True):
        assert torch.equal(a, b)


def test_accumulation_4x8_equals_one_batch_of_32() -> None:
    ds = tiny_dataset(32 * 5)
    big = tiny_mlp()
    opt = torch.optim.SGD(big.parameters(), lr=0.1)
    for x, y in DataLoader(ds, batch_size=32):
        opt.zero_grad()
        nn.functional.cross_entropy(big(x), y).backward()
        opt.step()

    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine, loader, _, _ = ember.initialize(
        model, opt, nn.CrossEntropyLoss(), DataLoader(ds, batch_size=8), config={"gradient_accumulation": 4}
    )
    updates = 0
    for x, y in loader:
        engine.zero_grad()
        engine.backward(engine.criterion(engine(x), y))
        updates += engine.step()
    assert updates == 5
    for a, b in zip(params_of(big), params_of(model), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_micro_steps_neither_update_nor_clip_and_updates_respect_max_norm() -> None:
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    engine, _, _, _ = ember.initialize(
        model, opt, nn.CrossEntropyLoss(), config={"gradient_accumulation": 3, "clip_grad_norm": 0.05}
    )
    x, y = tiny_dataset(12)[:]
    before = params_of(model)
    for i in range(3):
        engine.zero_grad()
        engine.backward(engine.criterion(engine(x[i * 4 : (i + 1) * 4]), y[i * 4 : (i + 1) * 4]))
        if i < 2:
            grads = [p.grad.clone() for p in model.parameters()]
            assert engine.step() is False
            assert engine.last_grad_norm is None  # no clipping on a micro-step
            assert all(torch.equal(a, b) for a, b in zip(before, params_of(model), strict=True))
            assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters(), strict=True))
    assert engine.step() is True
    applied = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert engine.last_grad_norm is not None and engine.last_grad_norm > 0.05  # it really had to clip
    assert applied <= 0.05 + 1e-6
    # With lr=1 and plain SGD the parameter change is exactly the clipped gradient.
    delta = torch.linalg.vector_norm(
        torch.stack([(a - b).norm() for a, b in zip(before, params_of(model), strict=True)])
    )
    assert delta <= 0.05 + 1e-6


def test_clip_grad_value_clamps_each_gradient_element_at_updates_only_like_a_hand_loop() -> None:
    x, y = tiny_dataset(12)[:]
    hand = tiny_mlp()
    hand_opt = torch.optim.SGD(hand.parameters(), lr=0.5, momentum=0.9)
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    config = {"gradient_accumulation": 3, "clip_grad_value": 0.01}
    engine, _, _, _ = ember.initialize(model, opt, nn.CrossEntropyLoss(), config=config)
    for i in range(6):
        xb, yb = x[(i % 3) * 4 : (i % 3 + 1) * 4], y[(i % 3) * 4 : (i % 3 + 1) * 4]
        (nn.functional.cross_entropy(hand(xb), yb) / 3).backward()
        if i % 3 == 2:  # the hand loop clamps the accumulated gradient once per update
            torch.nn.utils.clip_grad_value_(hand.parameters(), 0.01)
            hand_opt.step()
            hand_opt.zero_grad()
        engine.zero_grad()
        engine.backward(engine.criterion(engine(xb), yb))
        engine.step()
    assert max(p.grad.abs().max().item() for p in model.parameters()) <= 0.01
    for a, b in zip(params_of(hand), params_of(model), strict=True):
        assert torch.equal(a, b)


def test_zero_grad_clears_only_at_cycle_start() -> None:
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine, _, _, _ = ember.initialize(model, opt, nn.CrossEntropyLoss(), config={"gradient_accumulation": 2})
    x, y = tiny_dataset(8)[:]
    engine.zero_grad()
    engine.backward(engine.criterion(engine(x), y))
    engine.zero_grad()  # mid-cycle: must keep the accumulated gradient
    assert all(p.grad is not None for p in model.parameters())
    engine.backward(engine.criterion(engine(x), y))
    assert engine.step()
    engine.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_boundary_true_closes_a_short_cycle() -> None:
    model = tiny_mlp()
    engine, _, _, _ = ember.initialize(
        model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), config={"gradient_accumulation": 4}
    )
    x, y = tiny_dataset(8)[:]
    engine.backward(engine.criterion(engine(x), y), boundary=True)
    assert engine.sync_gradients and engine.step()


def test_bf16_autocast_on_cpu_trains() -> None:
    ds = tiny_dataset(256)
    model = tiny_mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    engine, loader, _, _ = ember.initialize(
        model, opt, nn.CrossEntropyLoss(), DataLoader(ds, batch_size=32, shuffle=True), config={"amp": "bf16"}
    )
    x, _ = ds[:4]
    assert engine(x).dtype == torch.bfloat16
    first = last = None
    for _ in range(8):
        for x, y in loader:
            engine.zero_grad()
            loss = engine.criterion(engine(x), y)
            engine.backward(loss)
            engine.step()
            first = loss.item() if first is None else first
            last = loss.item()
    assert last < first * 0.7
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_fp16_overflow_step_is_skipped_and_parameters_unchanged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="ember")
    model = tiny_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine, _, _, _ = ember.initialize(model, opt, nn.CrossEntropyLoss(), config={"amp": "fp16"})
    x, y = tiny_dataset(8)[:]

    engine.zero_grad()
    engine.backward(engine.criterion(engine(x), y))
    next(model.parameters()).grad[0, 0] = float("inf")
    before = params_of(model)
    assert engine.step() is False
    assert engine.last_step_skipped and engine.skipped_updates == 1
    assert all(torch.equal(a, b) for a, b in zip(before, params_of(model), strict=True))
    assert "fp16 overflow (inf/nan gradients) in update 1: update skipped, loss scale lowered to 32768" in caplog.text

    engine.zero_grad()
    engine.backward(engine.criterion(engine(x), y))
    assert engine.step() is True and not engine.last_step_skipped
    assert not all(torch.equal(a, b) for a, b in zip(before, params_of(model), strict=True))
    assert engine.state_dict()["skipped_updates"] == 1


def test_gradient_handlers_run_before_the_update() -> None:
    calls = []

    def zero_first(params: list[nn.Parameter]) -> None:
        calls.append(len(params))
        for p in params:
            p.grad.zero_()

    model = tiny_mlp()
    engine, _, _, _ = ember.initialize(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        nn.CrossEntropyLoss(),
        config={"gradient_handler": [zero_first]},
    )
    before = params_of(model)
    x, y = tiny_dataset(8)[:]
    engine.backward(engine.criterion(engine(x), y))
    engine.step()
    assert calls == [4]
    assert all(torch.equal(a, b) for a, b in zip(before, params_of(model), strict=True))


def test_state_dict_has_bare_model_keys_and_round_trips_mid_cycle() -> None:
    model = tiny_mlp()
    engine, _, _, _ = ember.initialize(
        model, torch.optim.Adam(model.parameters()), nn.CrossEntropyLoss(), config={"gradient_accumulation": 2}
    )
    x, y = tiny_dataset(8)[:]
    engine.backward(engine.criterion(engine(x), y))
    state = engine.state_dict()
    assert list(state["model"]) == list(tiny_mlp().state_dict())
    bare = tiny_mlp(seed=5)
    bare.load_state_dict(state["model"], strict=True)

    other = tiny_mlp(seed=9)
    engine2, _, _, _ = ember.initialize(
        other, torch.optim.Adam(other.parameters()), nn.CrossEntropyLoss(), config={"gradient_accumulation": 2}
    )
    engine2.load_state_dict(state)
    for e in (engine, engine2):
        e.backward(e.criterion(e(x), y))
        assert e.step()
    for a, b in zip(params_of(model), params_of(other), strict=True):
        assert torch.equal(a, b)


def test_eval_forward_under_no_grad_uses_no_autograd() -> None:
    model = tiny_mlp()
    engine, _, _, _ = ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1))
    engine.eval()
    with torch.no_grad():
        out = engine(torch.randn(2, 8))
    assert not out.requires_grad and not engine.training


def test_reset_accumulation_drops_a_half_cycle() -> None:
    model = tiny_mlp()
    engine, _, _, _ = ember.initialize(
        model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), config={"gradient_accumulation": 2}
    )
    x, y = tiny_dataset(8)[:]
    engine.backward(engine.criterion(engine(x), y))
    engine.reset_accumulation()
    assert engine.micro_step == 0 and all(p.grad is None for p in model.parameters())


def _nan_engine(**config: object) -> tuple[ember.engine.Engine, torch.Tensor, torch.Tensor]:
    model = tiny_mlp(0)
    engine, *_ = ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                                  config=config)  # fmt: skip
    x, y = tiny_dataset(8).tensors
    return engine, x, y


def _steps(engine: ember.engine.Engine, x: torch.Tensor, y: torch.Tensor, n: int, nan_at: int) -> None:
    for i in range(1, n + 1):
        engine.zero_grad()
        loss = engine.criterion(engine(x), y)
        engine.backward(loss * float("nan") if i == nan_at else loss)
        engine.step()


def test_a_non_finite_loss_stops_with_an_error_naming_the_step_before_it_is_back_propagated() -> None:
    from ember.errors import NonFiniteLossError

    engine, x, y = _nan_engine(gradient_accumulation=2)
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss \(nan\) at step 3 \(micro-batch 2 of") as caught:
        _steps(engine, x, y, 8, nan_at=6)
    assert caught.value.step == 3
    assert all(torch.isfinite(p).all() for p in engine.model.parameters())
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in engine.model.parameters())


def test_nonfinite_loss_warn_goes_on_and_says_so_and_ignore_does_not_look(caplog: pytest.LogCaptureFixture) -> None:
    engine, x, y = _nan_engine(nonfinite_loss="warn")
    _steps(engine, x, y, 4, nan_at=2)
    assert engine.check_loss() == 2 and "non-finite loss (nan) at step 2" in caplog.text
    quiet, x, y = _nan_engine(nonfinite_loss="ignore")
    _steps(quiet, x, y, 4, nan_at=2)
    assert quiet.loss_check is None and quiet.check_loss() is None


def test_on_an_accelerator_the_flag_stays_on_the_device_and_is_read_one_update_late() -> None:
    from ember.errors import NonFiniteLossError
    from ember.loss_check import LossCheck

    check = LossCheck("error", torch.device("cpu"), on_device=True)  # the accelerator's path, on the CPU
    check.note(torch.tensor(1.0), step=1, micro=1)
    check.boundary(1)
    check.note(torch.tensor(float("inf")), step=2, micro=1)  # no host read here
    check.boundary(2)  # reads update 1's flag (finite), sends update 2's
    with pytest.raises(NonFiniteLossError, match="at step 2"):
        check.settle()  # before a checkpoint: waits for update 2's flag


def test_an_engine_built_directly_takes_its_settings_as_arguments_and_matches_initialize() -> None:
    loader = DataLoader(tiny_dataset(32), batch_size=8)
    torch.manual_seed(0)
    direct_model = tiny_mlp()
    torch.manual_seed(0)
    built_model = tiny_mlp()
    direct = ember.engine.Engine(
        direct_model, torch.optim.SGD(direct_model.parameters(), lr=0.1), nn.CrossEntropyLoss(), torch.device("cpu"),
        gradient_accumulation=2, clip_grad_norm=0.5,
    )  # fmt: skip
    built = ember.initialize(
        built_model, torch.optim.SGD(built_model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
        config={"gradient_accumulation": 2, "clip_grad_norm": 0.5},
    )[0]  # fmt: skip
    assert direct.config == {} and built.config["gradient_accumulation"] == 2
    assert direct.schedule is None and built.schedule is None
    for engine in (direct, built):
        applied = []
        for x, y in loader:
            engine.zero_grad()
            engine.backward(engine.criterion(engine(x), y))
            applied.append(engine.step())
        assert applied == [False, True, False, True]
    assert all(torch.equal(a, b) for a, b in zip(params_of(direct_model), params_of(built_model), strict=True))
