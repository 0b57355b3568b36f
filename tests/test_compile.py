"""``compile=True``: the Engine trains a compiled model, keeps clean keys, and compiles before DDP.

A counting backend that runs dynamo's captured graph as is keeps this cheap (no C++ toolchain)
while proving the forward went through ``torch.compile``. The two-process part (DDP wraps the
compiled module, and trains like one process) is asserted in ``tests/test_ddp.py``, on the one
torchrun of ``tests/scripts/ddp_equivalence.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch._dynamo.eval_frame import OptimizedModule

import ember
from tests.models import params_of, tiny_dataset, tiny_mlp

GRAPHS: list[int] = []


@pytest.fixture(autouse=True)
def _forget_compiled_code():
    """Drop dynamo's caches after each test: compiled frames of these models must not outlive it."""
    yield
    torch._dynamo.reset()


def counting_backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
    """Run the captured graph unchanged, and count it."""
    GRAPHS.append(1)
    return gm.forward


def _train(config: dict[str, Any], steps: int = 6) -> tuple[ember.Engine, list[float]]:
    model = tiny_mlp()
    engine = ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                              config=config)[0]  # fmt: skip
    x, y = tiny_dataset(32).tensors
    losses = []
    for _ in range(steps):
        engine.zero_grad()
        loss = engine.criterion(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return engine, losses


def test_compiled_engine_runs_an_optimized_module_and_trains_like_eager() -> None:
    GRAPHS.clear()
    compiled, losses = _train({"compile": {"backend": counting_backend}})
    assert isinstance(compiled.wrapped_model, OptimizedModule)
    assert compiled.wrapped_model._orig_mod is compiled.model  # the user's module, compiled in place
    assert GRAPHS, "the forward never went through torch.compile"
    assert losses[-1] < losses[0]
    eager, eager_losses = _train({})
    assert not isinstance(eager.wrapped_model, OptimizedModule)
    assert losses == pytest.approx(eager_losses, abs=1e-6)
    for a, b in zip(params_of(compiled.model), params_of(eager.model), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_compile_true_uses_the_default_backend_on_an_optimized_module() -> None:
    model = tiny_mlp()
    engine = ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), config={"compile": True})[0]
    assert isinstance(engine.wrapped_model, OptimizedModule)  # built lazily: nothing compiles until a forward
    assert engine.model is model


def test_compiled_state_dict_keys_carry_no_wrapper_prefix_and_load_into_a_bare_model() -> None:
    engine, _ = _train({"compile": {"backend": counting_backend}}, steps=2)
    keys = list(engine.state_dict()["model"])
    assert keys == list(tiny_mlp().state_dict())
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in keys)
    bare = tiny_mlp(seed=5)
    bare.load_state_dict(engine.state_dict()["model"])  # strict: fails on any prefix
    assert all(torch.equal(a, b) for a, b in zip(params_of(bare), params_of(engine.model), strict=True))
