"""The lock-free queue behind Run.log and the writer thread's encoder: nothing lost, nothing twice."""

from __future__ import annotations

import json
import math
import threading

import pytest

from ember import track
from ember.errors import TrackingError
from ember.track import _writer
from ember.track._values import decode_point, encode_batch, encode_point


def _raw_lines(run: track.Run, type_: str) -> list[str]:
    return (run.path / "metrics" / f"{type_}.jsonl").read_text().splitlines()  # type: ignore[operator]


def test_points_logged_while_another_thread_flushes_are_written_once_in_order() -> None:
    run = track.create_run(name="race")
    writer = run._writer
    assert writer is not None
    stop = threading.Event()

    def flush_again_and_again() -> None:
        while not stop.is_set():
            writer.flush()

    flusher = threading.Thread(target=flush_again_and_again)
    flusher.start()
    try:
        for step in range(30_000):
            run.log("train", {"loss": step / 7}, step=step)
    finally:
        stop.set()
        flusher.join()
    run.finish()
    points = run.metrics("train")
    assert [p["step"] for p in points] == list(range(30_000))
    assert all(p["metrics"]["loss"] == p["step"] / 7 for p in points)


def test_changing_the_metrics_dict_after_the_call_does_not_change_the_point() -> None:
    run = track.create_run(name="reuse")
    metrics = {"loss": 1.0}
    run.log("train", metrics, step=0)
    metrics["loss"] = 2.0
    metrics["extra"] = 3.0
    run.log("train", metrics, step=1)
    run.finish()
    assert [p["metrics"] for p in run.metrics("train")] == [{"loss": 1.0}, {"loss": 2.0, "extra": 3.0}]


def test_last_step_counts_points_still_queued_and_points_written() -> None:
    run = track.create_run(name="last")
    writer = run._writer
    assert writer is not None
    with writer._flush_lock:  # hold the writer off: these points stay in the queue
        for step in range(5):
            run.log("train", {"loss": 1.0}, step=step)
        run.log("val", {"acc": 0.5}, step=3)
        assert len(writer.queue) == 6
    assert writer.last_step("train") == 4  # read while queued...
    run.flush()
    assert len(writer.queue) == 0
    assert run.last_step("train") == 4 and run.last_step("val") == 3 and run.last_step("test") is None
    run.finish()


def test_the_writer_wakes_early_when_wake_at_points_are_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ember.track.run.WAKE_AT", 10)
    run = track.create_run(name="wake")
    writer = run._writer
    assert writer is not None
    woken = threading.Event()
    monkeypatch.setattr(writer, "wake", woken.set)
    for step in range(9):
        run.log("train", {"loss": 1.0}, step=step)
    assert not woken.is_set()
    run.log("train", {"loss": 1.0}, step=9)
    assert woken.is_set()
    run.finish()


def test_a_failed_write_is_reported_at_the_next_call_and_later_points_are_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = track.create_run(name="disk-full")
    run.log("train", {"loss": 1.0}, step=0)
    run.flush()
    real_write_all = _writer.write_all
    calls = {"n": 0}

    def fail_once(fd: int, data: bytes) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(28, "No space left on device")
        real_write_all(fd, data)

    monkeypatch.setattr(_writer, "write_all", fail_once)
    run.log("train", {"loss": 2.0}, step=1)
    with pytest.raises(TrackingError, match=r"No space left on device.*up to 1 points"):
        run.flush()
    run.log("train", {"loss": 3.0}, step=2)  # the run stays usable
    run.finish()
    assert [p["step"] for p in run.metrics("train")] == [0, 2]


def test_ints_are_stored_exactly_and_ints_beyond_a_float_are_refused_at_the_call() -> None:
    run = track.create_run(name="ints")
    run.log("train", {"count": 2**62 + 1, "neg": -(2**1022)}, step=0)
    with pytest.raises(TrackingError, match=r"metric 'huge' = .* is too large"):
        run.log("train", {"ok": 1.0, "huge": 2**1023}, step=1)
    run.finish()
    (point,) = run.metrics("train")
    assert point["metrics"] == {"count": 2**62 + 1, "neg": -(2**1022)}


def _record(type_: str, step: int, metrics: dict, epoch: int | float | None = None, t: float = 1.5) -> tuple:
    return (type_, tuple(metrics), step, epoch, t, *metrics.values())


def test_encode_batch_keeps_the_order_of_each_type_across_interleaved_groups() -> None:
    batch = [
        _record("train", 0, {"loss": 0.5}),
        _record("train", 1, {"loss": 0.25, "lr": 0.1}),
        _record("val", 1, {"acc": 0.75}, epoch=0),
        _record("train", 2, {"loss": 0.125}, epoch=1.5),
        _record("train", 3, {"loss": 0.0625}),
    ]
    last: dict[str, int] = {"val": 7}
    out = encode_batch(batch, last)
    train = [decode_point(line) for line in "".join(out["train"]).splitlines()]
    assert [(p["step"], p["epoch"], p["metrics"]) for p in train] == [
        (0, None, {"loss": 0.5}),
        (1, None, {"loss": 0.25, "lr": 0.1}),
        (2, 1.5, {"loss": 0.125}),
        (3, None, {"loss": 0.0625}),
    ]
    assert "".join(out["val"]) == '{"step":1,"epoch":0,"time":1.500,"metrics":{"acc":0.75}}\n'
    assert last == {"train": 3, "val": 7}  # a higher step already known is kept


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_value_in_a_group_is_written_as_strict_json(bad: float) -> None:
    batch = [_record("train", s, {"loss": bad if s == 1 else 1.0 / (s + 1), "n": s}) for s in range(3)]
    lines = "".join(encode_batch(batch, {})["train"]).splitlines()
    for line in lines:
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    value = decode_point(lines[1])["metrics"]["loss"]
    assert (math.isnan(value) and math.isnan(bad)) or value == bad
    assert [decode_point(line)["metrics"]["n"] for line in lines] == [0, 1, 2]


@pytest.mark.parametrize("name", ['"epoch":None', '":nan', "100%", 'a"b\\c', "ünï"])
def test_metric_names_that_look_like_the_encoding_are_kept_verbatim(name: str) -> None:
    line = encode_point(4, None, 2.0, {name: 0.5, "x": 1})
    assert decode_point(line) == {"step": 4, "epoch": None, "time": 2.0, "metrics": {name: 0.5, "x": 1}}


def test_time_is_written_to_the_millisecond() -> None:
    point = decode_point(encode_point(0, None, 1779272100.1234567, {"loss": 1.0}))
    assert point["time"] == 1779272100.123
