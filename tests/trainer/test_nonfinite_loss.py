"""A loss that is not finite is not silent: by default fit stops with an error naming the step and
the run is Failed; with nonfinite_loss='warn' it goes on, and every checkpoint saved after it says
so while retention keeps the last one saved before it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from ember import checkpoint, track
from ember.checkpoint.io import find_checkpoints
from ember.errors import NonFiniteLossError
from ember.trainer import Trainer, hooks
from tests.trainer.helpers import RecordingLogger, loader, make_engine


class NaNFrom(nn.Module):
    """Cross-entropy, NaN from the ``n``-th call on."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.calls = n, 0

    def forward(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        loss = nn.functional.cross_entropy(out, y)
        return loss * float("nan") if self.calls >= self.n else loss


def _finite(path: Path) -> bool:
    return all(torch.isfinite(t).all() for t in checkpoint.model_state(path).values())


def test_by_default_fit_stops_at_the_first_non_finite_loss_with_an_error_and_the_run_is_failed(tmp_path: Path) -> None:
    trainer = Trainer(make_engine(criterion=NaNFrom(6)))
    tracking = hooks.TrackingHook(home=str(tmp_path))
    ckpt = hooks.CheckpointHook(tmp_path / "ckpt", every_n_steps=1, every_n_epochs=None, keep_last=None)
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss \(nan\) at step 6"):
        trainer.fit(loader(64, 8), epochs=3, hooks=[ckpt, tracking])
    assert trainer.cur_step == 5  # the bad update was not applied
    run = track.load_run(tracking.run.path, home=tmp_path)
    assert run.status == "Failed" and "at step 6" in (run.reason or "")
    saved = find_checkpoints(tmp_path / "ckpt")
    assert [c.step for c in saved] == [1, 2, 3, 4, 5] and all(_finite(c.path) for c in saved)


def test_with_warn_training_goes_on_and_checkpoints_after_it_say_so_keeping_the_last_finite_one(
    tmp_path: Path,
) -> None:
    logger = RecordingLogger()
    trainer = Trainer(make_engine(criterion=NaNFrom(6), nonfinite_loss="warn"), logger=logger)
    ckpt = hooks.CheckpointHook(tmp_path, every_n_steps=2, every_n_epochs=None, keep_last=1)
    trainer.fit(loader(64, 8), epochs=2, hooks=[ckpt])
    assert trainer.cur_step == 16
    warned = logger.lines("is saved after a non-finite loss at step 6")
    assert len(warned) >= 5 and all("retention keeps ckpt-e0000-s000000004.ckpt, saved before it" in w for w in warned)
    kept = [c.path.name for c in find_checkpoints(tmp_path)]
    assert kept == ["ckpt-e0000-s000000004.ckpt", "ckpt-e0002-s000000016.ckpt"]
    assert _finite(tmp_path / kept[0]) and not _finite(tmp_path / kept[1])
