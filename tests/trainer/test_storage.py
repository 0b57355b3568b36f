"""The per-step storage (CPU values read at once, others lazily) and the per-epoch history."""

from __future__ import annotations

import math

import pytest
import torch

from ember.errors import TrainerError
from ember.trainer.storage import Cursor, History, StepStorage, UnknownScalarError, held


def test_put_scalar_keeps_tensors_without_reading_them() -> None:
    storage = StepStorage()
    storage.step = 3
    storage.put_scalar("loss", torch.empty((), device="meta"))  # reading a meta tensor would raise
    storage.put_scalars(lr=0.1)
    assert storage.names() == ["loss", "lr"] and storage.latest_step("loss") == 3


def test_put_scalar_reads_a_cpu_tensor_at_once_and_keeps_the_float() -> None:
    storage = StepStorage()
    loss = torch.tensor(0.25, requires_grad=True) * 2
    storage.put_scalar("loss", loss)
    with torch.no_grad():
        loss.add_(1)  # what was put is the value at the put, not the tensor
    assert storage.values("loss") == [(0, 0.5)] and type(held(torch.tensor(2.0))) is float
    assert held(torch.empty((), device="meta")).is_meta  # an accelerator's value stays a tensor


def test_storage_reads_latest_means_and_windows() -> None:
    storage = StepStorage(window=3)
    for step, v in enumerate([1.0, 2.0, 3.0, 4.0], start=1):
        storage.put_scalar("loss", torch.tensor(v), step=step)
    assert storage.latest("loss") == 4.0
    assert storage.mean("loss") == 3.0 and storage.mean("loss", 2) == 3.5
    assert storage.values("loss") == [(2, 2.0), (3, 3.0), (4, 4.0)]
    assert storage.latest_all() == {"loss": 4.0}
    with pytest.raises(TrainerError, match="one-element"):
        storage.put_scalar("bad", torch.ones(2))
    with pytest.raises(TrainerError, match="known: loss"):
        storage.latest("nope")


def test_a_cursor_reads_each_value_once_by_when_it_was_put_not_by_its_step_tag() -> None:
    storage, cursor = StepStorage(window=4), Cursor()
    storage.step = 1
    storage.put_scalars(loss=torch.tensor(1.0), lr=0.1)
    storage.put_scalar("loss", torch.tensor(3.0))  # a second micro-batch, same step tag
    assert storage.read_new(cursor, "mean") == {"loss": 2.0, "lr": 0.1}
    assert storage.read_new(cursor) == {}  # nothing new since
    storage.put_scalar("loss", 5.0, step=0)  # an older tag still counts as new
    assert storage.read_new(cursor, "mean") == {"loss": 5.0}
    for v in range(10, 16):  # more puts than the window keeps: the kept four are new
        storage.put_scalar("loss", float(v))
    assert storage.read_new(cursor, "mean") == {"loss": 13.5}
    storage.put_scalar("loss", 20.0)
    storage.put_scalar("loss", 30.0)
    assert storage.read_new(Cursor()) == {"loss": 30.0, "lr": 0.1}  # a fresh cursor reads everything, newest
    assert storage.read_new(cursor, "latest") == {"loss": 30.0}
    with pytest.raises(TrainerError, match="'latest' or 'mean'"):
        storage.read_new(cursor, "median")  # type: ignore[arg-type]


def test_totals_give_the_mean_of_every_value_the_window_dropped_too() -> None:
    storage = StepStorage(window=3, totals=True)
    for v in range(1, 301):  # 297 leave the window: two folds of 128 and 41 pending
        storage.put_scalar("time", torch.tensor(float(v)) if v % 2 else v)
    assert storage.values("time") == [(0, 298.0), (0, 299.0), (0, 300.0)]
    assert storage.global_mean("time") == pytest.approx(150.5)
    assert storage.mean("time") == 299.0
    storage.clear()
    storage.put_scalar("time", 2.0)
    assert storage.global_mean("time") == 2.0
    plain = StepStorage()
    plain.put_scalar("time", 1.0)
    with pytest.raises(TrainerError, match="totals=True"):
        plain.global_mean("time")


def test_an_unknown_name_is_a_key_error_too() -> None:
    with pytest.raises(UnknownScalarError, match="no scalar 'loss'") as info:
        StepStorage().latest("loss")
    assert isinstance(info.value, KeyError) and isinstance(info.value, TrainerError)
    assert str(info.value).startswith("no scalar")  # not KeyError's quoted form


def test_history_keeps_per_epoch_values_latest_and_best() -> None:
    h = History()
    for epoch, (loss, acc) in enumerate([(0.9, 0.5), (0.4, 0.8), (0.6, 0.7), (float("nan"), 0.8)]):
        h.record("test/loss", loss, epoch, mode="min")
        h.record("test/accuracy", torch.tensor(acc), epoch, mode="max")
    assert h.epochs("test/loss") == [0, 1, 2, 3] and math.isnan(h.latest("test/loss"))
    assert h.best("test/loss") == 0.4 and h.best_epoch("test/loss") == 1
    assert h.best("test/accuracy") == pytest.approx(0.8) and h.best_epoch("test/accuracy") == 1
    assert h.best("test/loss", mode="max") == 0.9
    assert h.at(2) == {"test/loss": 0.6, "test/accuracy": pytest.approx(0.7)}
    assert h.get("test/loss", 7) is None


def test_history_state_round_trips_and_unknown_modes_are_explained() -> None:
    h = History()
    h.record("train/loss", 1.5, 0, mode="min")
    h.record("time", 2.0, 0)
    other = History()
    other.load_state_dict(h.state_dict())
    assert other.state_dict() == h.state_dict()
    with pytest.raises(TrainerError, match="mode='min' or 'max'"):
        h.best("time")
    with pytest.raises(TrainerError, match="no metric"):
        h.latest("test/loss")
