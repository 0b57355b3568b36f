"""Bad input gets one ember error that names the culprit, raised before any torch internals."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import ember
from ember.errors import EmberError
from tests.models import tiny_dataset, tiny_mlp


def _init(config=None, **kw):
    model = kw.pop("model", None) or tiny_mlp()
    opt = kw.pop("optimizer", None) or torch.optim.SGD(model.parameters(), lr=0.1)
    return ember.initialize(model, opt, kw.pop("criterion", nn.CrossEntropyLoss()), config=config, **kw)


def _engine(**config):
    return _init(config or None)[0]


def _write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text)
    return path


def _foreign_optimizer():
    return _init(optimizer=torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1))


def _scheduler_for_other_optimizer():
    model = tiny_mlp()
    other = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    return _init(model=model, lr_scheduler=torch.optim.lr_scheduler.StepLR(other, 1))


CASES: list[tuple[str, Callable[[Path], object], str]] = [
    ("misspelt key", lambda t: _init({"gradient_accumulaton": 2}), "gradient_accumulation"),
    ("accumulation as a string", lambda t: _init({"gradient_accumulation": "4"}), "gradient_accumulation"),
    ("accumulation 0", lambda t: _init({"gradient_accumulation": 0}), "gradient_accumulation"),
    ("negative clip", lambda t: _init({"clip_grad_norm": -1.0}), "clip_grad_norm"),
    ("unknown amp", lambda t: _init({"amp": "fp8"}), "amp"),
    ("missing config file", lambda t: ember.launch(config=t / "nope.py", verbose=False), "nope.py"),
    ("broken config file", lambda t: ember.launch(config=_write(t, "bad.py", "x = = 1\n"), verbose=False), "bad.py"),
    ("launch without torchrun variables", lambda t: ember.launch_from_torch(verbose=False), "RANK"),
    ("world size mismatch", lambda t: _init({"parallel": {"data": 2}}), "parallel.data"),
    ("rank outside world", lambda t: ember.launch(rank=2, world_size=2, verbose=False), "rank 2"),
    ("nccl without cuda", lambda t: ember.launch(backend="nccl", verbose=False), "nccl"),
    (
        "non-module model",
        lambda t: ember.initialize(lambda x: x, torch.optim.SGD([nn.Parameter(torch.zeros(1))])),
        "Module",
    ),
    ("optimizer over other parameters", lambda t: _foreign_optimizer(), "not a parameter of the model"),
    ("not an optimizer", lambda t: _init(optimizer=object()), "torch.optim.Optimizer"),
    ("criterion not callable", lambda t: _init(criterion=42), "criterion"),
    ("scheduler of another optimizer", lambda t: _scheduler_for_other_optimizer(), "lr_scheduler"),
    ("dataloader that is a list", lambda t: _init(train_dataloader=[1, 2]), "DataLoader"),
    ("non-scalar loss", lambda t: _engine().backward(torch.ones(3, requires_grad=True)), "scalar"),
    ("loss without grad", lambda t: _engine().backward(torch.tensor(1.0)), "does not require grad"),
    ("engine without criterion", lambda t: _init(criterion=None)[0].criterion(1, 2), "no criterion"),
    ("engine state without model", lambda t: _engine().load_state_dict({"weight": 1}), "missing"),
    ("tensor size that does not fit the world", lambda t: _init({"parallel": {"tensor": 3}}), "parallel.tensor"),
]


@pytest.mark.parametrize(("what", "call", "culprit"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_one_ember_error_naming_the_culprit(
    what: str, call: Callable[[Path], object], culprit: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(EmberError) as info:
        call(tmp_path)
    assert culprit in str(info.value)
    # The ember error is the first thing the user sees: no chained torch traceback above it.
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__


def test_initialize_under_torchrun_variables_without_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ember.errors.LaunchError, match="launch_from_torch"):
        _init(train_dataloader=DataLoader(tiny_dataset(8)))
