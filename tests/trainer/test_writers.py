"""Writers fed from the step storage: one hub of per-step scalars, read by the step logger,
TensorBoard and tracking; throughput measured once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from ember import track
from ember.errors import HookError
from ember.trainer import Trainer, hooks
from ember.trainer.hooks.tracking import EPOCH_POINT_TYPES, point_name
from ember.trainer.hooks.writer import StepWriter
from tests.trainer.helpers import RecordingLogger, loader, make_engine


class Put(hooks.BaseHook):
    """Puts ``grad_scale`` (the micro-step's number) into the storage every batch, and keeps what it put."""

    def __init__(self) -> None:
        super().__init__()
        self.put: list[float] = []

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        value = float(self.trainer.micro_step)
        self.put.append(value)
        self.trainer.storage.put_scalar("grad_scale", torch.tensor(value))


class Collect(StepWriter):
    def __init__(self, every_n: int, reduce: str) -> None:
        super().__init__(every_n)
        self.reduce = reduce  # type: ignore[assignment]
        self.written: list[tuple[int, dict[str, float]]] = []

    def write(self, step: int, scalars: dict[str, float]) -> None:
        self.written.append((step, scalars))


@pytest.mark.parametrize("reduce", ["mean", "latest"])
def test_a_writer_gets_every_micro_batchs_values_since_its_last_write_and_the_lr(reduce: str) -> None:
    put, writer = Put(), Collect(every_n=2, reduce=reduce)
    Trainer(make_engine(accumulation=2)).fit(loader(64, 8), epochs=1, hooks=[put, writer])
    # 8 batches, accumulation 2: 4 updates, a write at updates 2 and 4, each over 4 micro-batches
    # (the first micro-batch of a cycle is tagged with the step before: it counts all the same)
    assert [step for step, _ in writer.written] == [2, 4]
    for (_, scalars), values in zip(writer.written, (put.put[:4], put.put[4:]), strict=True):
        expected = sum(values) / 4 if reduce == "mean" else values[-1]
        assert scalars == {"grad_scale": expected, "lr": 0.1}


def test_a_writer_without_write_says_so_and_a_bad_every_n_is_named() -> None:
    class Forgot(StepWriter):
        pass

    with pytest.raises(NotImplementedError, match="Forgot must implement write"):
        Trainer(make_engine()).fit(loader(8, 8), epochs=1, hooks=[Forgot(every_n=1)])
    with pytest.raises(HookError, match=r"TrackingHook\(log_every_n_steps=...\) must be a positive int"):
        hooks.TrackingHook(log_every_n_steps=0)
    with pytest.raises(HookError, match=r"ThroughputHook\(every_n=...\) must be a positive int"):
        hooks.ThroughputHook(every_n=0)


def test_the_step_log_line_averages_every_micro_batch_of_its_updates() -> None:
    log, put = RecordingLogger(), Put()
    Trainer(make_engine(accumulation=2)).fit(loader(64, 8), epochs=1,
                                             hooks=[put, hooks.LogMetricByStepHook(2, log)])  # fmt: skip
    # micro-steps 1..4, then 5..8: micro-step 5 is tagged with step 2 and is in the second line
    assert log.lines("step ") == [
        "step 2 | epoch 1 | grad_scale 2.5 | lr 0.1",
        "step 4 | epoch 1 | grad_scale 6.5 | lr 0.1",  # before the hub: 7 (micro-step 5 was dropped)
    ]


def test_tracking_writes_what_the_storage_holds_and_the_throughput_hooks_measurement(tmp_path: Path) -> None:
    speed = hooks.ThroughputHook(every_n=2, logger=False)
    tracking = hooks.TrackingHook(system_interval_s=None, home=str(tmp_path))
    trainer = Trainer(make_engine())
    trainer.fit(loader(32, 8), epochs=1, hooks=[hooks.LossHook(), Put(), speed, tracking])
    assert tracking._meter is None  # measured once: by the ThroughputHook
    points = track.load_run(tracking.run.path, home=tmp_path).metrics("train")
    assert [p["step"] for p in points] == [1, 2, 3, 4]
    assert [p["metrics"]["grad_scale"] for p in points] == [1.0, 2.0, 3.0, 4.0]  # a hook's own scalar
    losses = [v for _, v in trainer.storage.values("train/loss")]
    assert [p["metrics"]["loss"] for p in points] == losses
    rates = [p["metrics"].get("samples_per_s") for p in points]
    measured = [v for _, v in trainer.storage.values("throughput/samples_per_s")]
    assert rates[0] is None and rates[2] is None and [rates[1], rates[3]] == measured  # every 2 updates
    assert points[1]["metrics"]["time/step_s"] == trainer.storage.values("time/step_s")[0][1]


def test_tracking_names_and_phase_types() -> None:
    assert [point_name(n) for n in ("train/loss", "throughput/samples_per_s", "time/step_s", "lr", "grad_scale")] == [
        "loss", "samples_per_s", "time/step_s", "lr", "grad_scale"
    ]  # fmt: skip
    assert EPOCH_POINT_TYPES == {"train": "train_epoch", "test": "val"}


def test_tracking_refuses_two_scalars_that_would_share_a_point_name(tmp_path: Path) -> None:
    class PutLoss(hooks.BaseHook):
        def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
            self.trainer.storage.put_scalar("loss", 1.0)  # and the LossHook puts train/loss

    tracking = hooks.TrackingHook(system_interval_s=None, home=str(tmp_path))
    with pytest.raises(HookError, match=r"\['train/loss', 'loss'\] -> 'loss'"):
        Trainer(make_engine()).fit(loader(8, 8), epochs=1, hooks=[hooks.LossHook(), PutLoss(), tracking])
