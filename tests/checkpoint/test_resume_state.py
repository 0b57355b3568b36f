"""Resume in one process: the fp16 gradient scaler round-trips, and a mid-epoch resume reads only what is left.

Both crash the job of ``tests/checkpoint/common.py`` at batch 12 (epoch 1, the first batch of an
accumulation cycle), so its newest checkpoint is update 6's: batch 11, 2 batches into epoch 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

from ember import checkpoint
from ember.trainer import hooks
from tests.checkpoint import common
from tests.checkpoint.common import Crash, epoch_order, params
from tests.models import tiny_dataset

STEP6 = "ckpt-e0001-s000000006.ckpt"  # update 6: batch 11, 2 batches (16 samples) into epoch 1
# fp16 on the CPU; the huge initial scale overflows updates 1, 2, 5... and a short growth interval
# grows it back, so the saved scale (and the growth tracker) are far from their defaults.
FP16_NEWEST = "ckpt-e0001-s000000003.ckpt"  # batch 11 again: skipped updates are not counted as steps
FP16 = {"amp": "fp16", "grad_scaler": {"init_scale": 2.0**20, "growth_interval": 2}}


class Scales(hooks.BaseHook):
    """The loss scale and the Engine's skipped-update count after every batch."""

    def __init__(self) -> None:
        super().__init__(name="Scales")
        self.after: dict[int, tuple[float, int]] = {}

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        engine = self.trainer.engine
        self.after[self.trainer.micro_step] = (engine.precision.loss_scale, engine.skipped_updates)


def test_the_fp16_gradient_scaler_is_resumed_exactly(tmp_path: Path) -> None:
    ref = common.run(None, config=FP16, extra=[Scales()])
    ref_scales = ref.get_hook("Scales").after  # type: ignore[attr-defined]
    assert ref.engine.skipped_updates >= 3  # overflows happened, before the checkpoint and after it

    with pytest.raises(RuntimeError, match="crashed"):
        common.run(tmp_path, config=FP16, extra=[Crash(12)], every_n_steps=1)
    saved = checkpoint.read(tmp_path / FP16_NEWEST)
    engine = saved["engine"]
    # updates 1, 2 and 5 overflowed (2**20 -> 2**18) and were skipped; update 6 was the first good one since
    assert (saved["trainer"]["epoch_iter"], engine["num_updates"], engine["skipped_updates"]) == (2, 6, 3)
    assert engine["precision"]["scaler"]["scale"] == 2.0**18 == ref_scales[11][0]
    assert engine["precision"]["scaler"]["_growth_tracker"] == 1  # one more good update grows it

    trainer = common.run(tmp_path, config=FP16, extra=[Scales()], every_n_steps=1)
    assert trainer.get_hook("CheckpointHook").resumed_from == tmp_path / FP16_NEWEST  # type: ignore[attr-defined]
    assert trainer.get_hook("Recorder").resumed_at == 11  # type: ignore[attr-defined]
    scales = trainer.get_hook("Scales").after  # type: ignore[attr-defined]
    assert scales == {b: ref_scales[b] for b in range(12, common.EPOCHS * 9 + 1)}  # every overflow at the same update
    assert trainer.engine.precision.state_dict() == ref.engine.precision.state_dict()
    assert all(torch.equal(a, b) for a, b in zip(params(trainer), params(ref), strict=True))
    losses = trainer.get_hook("Recorder").losses  # type: ignore[attr-defined]
    assert losses == {b: ref.get_hook("Recorder").losses[b] for b in range(12, 28)}  # type: ignore[attr-defined]


class Counting(Dataset[Any]):
    """A dataset that records every index it is asked for."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reads: list[int] = []

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        self.reads.append(int(index))
        return self.inner[index]


def test_a_mid_epoch_resume_reads_only_the_samples_the_epoch_has_left(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="crashed"):
        common.run(tmp_path / "ckpt", extra=[Crash(12)])
    train_set, test_set = Counting(tiny_dataset(common.N, 1)), Counting(tiny_dataset(20, 5))
    trainer, train, test = common.build(datasets=(train_set, test_set))
    train_set.reads.clear()
    test_set.reads.clear()

    ckpt = hooks.CheckpointHook(tmp_path / "new", every_n_epochs=None, save_last=False)
    trainer.fit(train, epochs=common.EPOCHS, test_dataloader=test, hooks=common.hook_list(trainer, ckpt),
                resume=tmp_path / "ckpt" / STEP6)  # fmt: skip
    assert trainer.get_hook("Recorder").resumed_at == 11  # type: ignore[attr-defined]
    # epoch 1 from its 17th sample (2 batches of 8 were consumed before the save), then all of epoch 2:
    # the 16 consumed samples are not read again, not even to be thrown away
    assert train_set.reads == epoch_order(1)[16:] + epoch_order(2)
    assert test_set.reads == list(range(20)) * 2  # the test passes after epochs 1 and 2, kept apart
    assert (trainer.cur_epoch, trainer.cur_step, trainer.micro_step) == (3, 15, 27)
