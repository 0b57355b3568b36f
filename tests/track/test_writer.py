"""The lock-free queue behind Run.log and the writer thread's encoder: nothing lost, nothing twice."""

from __future__ import annotations

import gc
import json
import math
import random
import threading
import time
from typing import Any

import pytest

from ember import track
from ember.errors import TrackingError
from ember.track import _writer
from ember.track._queue import PointQueue, encode_point
from ember.track._values import decode_point


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
        assert writer.queued() == 6
    assert writer.last_step("train") == 4  # read while queued...
    run.flush()
    assert writer.queued() == 0 and writer.pending.end() == 0
    assert run.last_step("train") == 4 and run.last_step("val") == 3 and run.last_step("test") is None
    run.finish()


def test_the_writer_wakes_early_when_wake_at_slots_are_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ember.track.run.WAKE_AT", 70)  # 7 slots a point of one metric
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
    return (type_, step, epoch, t, metrics)


def encode_batch(records: list[tuple], last_steps: dict[str, int], limit: int = 1 << 62) -> dict[str, list[str]]:
    """Encode queued points the way the writer does, in chunks of ``limit`` points."""
    queue = PointQueue()
    for record in records:
        queue.put(*record)
    out: dict[str, list[str]] = {}
    i = 0
    while i < queue.end():
        texts, i, _ = queue.encode(i, queue.end(), last_steps, limit)
        for type_, lines in texts.items():
            out.setdefault(type_, []).extend(lines)
    return out


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


def test_runs_of_alike_points_are_found_even_where_a_slot_of_another_layout_looks_alike() -> None:
    # Types that are also metric names, counts equal to values, runs of every length: the text
    # must be what encoding point by point gives, whatever the chunk size.
    rng = random.Random(0)
    layouts = [("train", ("a",)), ("train", ("a", "b")), ("train", ("b",)), ("train", ("train",)),
               ("a", ("train",)), ("val", ("val", "a")), ("val", ("b",))]  # fmt: skip
    records = []
    for step in range(600):
        type_, names = rng.choice(layouts) if rng.random() < 0.3 else layouts[0]
        values = {name: rng.choice([1, 2, 1.0, 0.5, 2**62, -3]) for name in names}
        records.append(_record(type_, step, values, epoch=rng.choice([None, 1, 2, 1.5]), t=step / 3))
    one_by_one: dict[str, list[str]] = {}
    for record in records:
        for type_, lines in encode_batch([record], {}).items():
            one_by_one.setdefault(type_, []).extend(lines)
    expected = {type_: "".join(lines) for type_, lines in one_by_one.items()}
    for limit in (1, 3, 64, 1 << 62):
        last: dict[str, int] = {}
        assert {t: "".join(lines) for t, lines in encode_batch(records, last, limit).items()} == expected
        assert last == {t: max(r[1] for r in records if r[0] == t) for t in expected}


def test_run_log_queues_nothing_the_garbage_collector_tracks() -> None:
    # A tuple or dict per queued point made the collector run every few hundred calls and a
    # full collection of everything torch had allocated; atoms in one flat list do neither.
    run = track.create_run(name="gc")
    writer = run._writer
    assert writer is not None
    with writer._flush_lock:  # hold the writer off: every point stays queued
        gc.collect()
        gc.disable()
        try:
            before = gc.get_count()[0]
            for step in range(5_000):
                run.log("train", {"loss": step / 7, "lr": 0.1}, step=step, epoch=step // 1000)
            grown = gc.get_count()[0] - before
        finally:
            gc.enable()
        assert writer.queued() == 5_000
        assert not any(map(gc.is_tracked, writer.pending._slots))
    assert grown < 50  # was 10,000: two tuples a point
    run.finish()
    assert [p["step"] for p in run.metrics("train")] == list(range(5_000))


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


def test_a_writer_thread_that_dies_of_a_bug_makes_every_later_call_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    run = track.create_run(name="writer-bug")

    def broken(*args: object) -> None:
        raise ValueError("a bug in the encoder")

    monkeypatch.setattr(PointQueue, "encode", broken)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # the traceback it would print
    run.log("train", {"loss": 1.0}, step=0)
    run._writer.wake()  # type: ignore[union-attr]
    run._writer._thread.join(5)  # type: ignore[union-attr]
    for step in (1, 2):  # not only once: nothing would write the points any more
        with pytest.raises(TrackingError, match=r"background writer .* stopped: ValueError"):
            run.log("train", {"loss": 2.0}, step=step)
    monkeypatch.undo()
    with pytest.raises(TrackingError, match="stopped"):  # finish still writes what is queued, then says so
        run.finish("Failed")
    assert track.load_run(run.path).status == "Failed"
    assert [p["step"] for p in run.metrics("train")] == [0]  # steps 1, 2 were refused, step 0 kept


def test_the_queue_is_bounded_a_logging_loop_waits_for_a_slow_writer_and_loses_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ember.track import run as run_module

    monkeypatch.setattr(_writer, "MAX_QUEUED", 7 * 500, raising=False)  # 500 points of one metric
    monkeypatch.setattr(run_module, "WAKE_AT", 7 * 100)
    real_encode = PointQueue.encode

    def slow_encode(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.002)  # a writer far slower than the loop
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(PointQueue, "encode", slow_encode)
    run = track.create_run(name="bounded")
    assert run._writer is not None
    most = 0
    for step in range(5_000):
        run.log("train", {"loss": float(step)}, step=step)
        most = max(most, run._writer.pending.end())
    run.finish()
    assert most <= 7 * 500 + 7  # never more than the bound and the point that reached it
    assert [p["step"] for p in run.metrics("train")] == list(range(5_000))


def test_the_point_queue_gives_back_each_point_once_and_drops_only_what_was_encoded() -> None:
    queue = PointQueue()
    queue.put("train", 0, None, 1.0, {"loss": 0.5})
    queue.put("val", 3, 1, 2.0, {"acc": 0.75, "n": 4})
    middle = queue.end()
    queue.put("train", 1, None, 3.0, {"loss": 0.25})
    assert list(queue.points()) == [("train", 0), ("val", 3), ("train", 1)]
    texts, position, count = queue.encode(0, middle, {})
    assert (sorted(texts), count) == (["train", "val"], 2)
    queue.advance(position)
    assert list(queue.points()) == [("train", 1)]


def test_coerce_metrics_copies_unless_the_caller_is_done_with_the_dict_before_returning() -> None:
    from ember.track._values import coerce_metrics

    metrics = {"loss": 0.5, "n": 3}
    assert coerce_metrics(metrics) == metrics and coerce_metrics(metrics) is not metrics
    assert coerce_metrics(metrics, copy=False) is metrics  # Run.log: put() copies the values at once
