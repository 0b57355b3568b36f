"""detectron2's checkpointer on ember against fvcore's own (from PyPI): the same files, both ways.

``Checkpointer(model, save_dir, optimizer=..., scheduler=...)`` without a trainer writes fvcore's
layout (``model``, each object by name, ``iteration``); fvcore reads what ember wrote and ember
what fvcore wrote, and ``resume_or_load`` restores every object at once (a ``StepLR``'s
``last_epoch`` 12 after 12 steps, as detectron2 gives).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fvcore.common.checkpoint import Checkpointer as FvcoreCheckpointer
from torch import nn

from ember.compat.detectron2.checkpoint import DetectionCheckpointer
from ember.errors import CheckpointError


def _objects(seed: int, steps: int) -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.StepLR]:
    torch.manual_seed(seed)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 3)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(5, 4)).square().mean().backward()
        opt.step()
        sched.step()
    return model, opt, sched


def _same(a: tuple, b: tuple) -> None:
    for x, y in zip(a[0].state_dict().values(), b[0].state_dict().values(), strict=True):
        assert torch.equal(x, y)
    for x, y in zip(a[1].state_dict()["state"].values(), b[1].state_dict()["state"].values(), strict=True):
        assert torch.equal(x["momentum_buffer"], y["momentum_buffer"])
    assert b[2].last_epoch == a[2].last_epoch == 12 and b[1].param_groups[0]["lr"] == pytest.approx(1e-5)


@pytest.mark.parametrize("writer", ["ember", "fvcore"])
def test_checkpoints_of_model_optimizer_and_scheduler_go_both_ways_with_fvcore(tmp_path: Path, writer: str) -> None:
    saved = _objects(0, 12)
    make = DetectionCheckpointer if writer == "ember" else FvcoreCheckpointer
    make(saved[0], str(tmp_path), optimizer=saved[1], scheduler=saved[2]).save("model_0011", iteration=11)
    assert (tmp_path / "last_checkpoint").read_text().strip() == "model_0011.pth"
    for reader in (DetectionCheckpointer, FvcoreCheckpointer):
        fresh = _objects(1, 0)
        extra = reader(fresh[0], str(tmp_path), optimizer=fresh[1], scheduler=fresh[2]).resume_or_load("", resume=True)
        assert extra["iteration"] == 11
        _same(saved, fresh)
    plain = torch.load(tmp_path / "model_0011.pth", weights_only=True)
    assert set(plain) == {"model", "optimizer", "scheduler", "iteration"}


def test_a_damaged_or_foreign_file_is_a_checkpoint_error(tmp_path: Path) -> None:
    model = nn.Linear(4, 2)
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"junk\.pth"):
        DetectionCheckpointer(model, str(tmp_path)).load(str(tmp_path / "junk.pth"))
    torch.save({"weights": model.state_dict()}, tmp_path / "other.pth")
    with pytest.raises(CheckpointError, match="has no 'model' state dict"):
        DetectionCheckpointer(model, str(tmp_path)).load(str(tmp_path / "other.pth"))
