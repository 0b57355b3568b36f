"""The queue between ``Run.log`` and the writer thread, and its encoding into JSON Lines.

Only :class:`PointQueue` knows how a queued point is laid out; ``Run.log`` puts points in, the
writer encodes them, iterates over them and drops them from the front.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from ember.track._values import encode_metrics, strict_dumps

_HEAD = 5
"""Slots before the names in a queued point: type, n, step, epoch, time."""


class PointQueue:
    """Points logged and not yet written, as the slots of one flat list.

    A point is queued as consecutive slots, added by one ``list.extend`` (atomic under the GIL,
    so ``put`` needs no lock)::

        type, n, step, epoch, time, name_1 ... name_n, value_1 ... value_n

    Only str, int, float and None: no object the garbage collector tracks, so a long queue
    neither triggers nor slows collections. Positions (what :meth:`end` returns and
    :meth:`encode` and :meth:`advance` take) count slots; :meth:`end` read at any moment ends a
    point. One thread takes points off the front (:meth:`advance`) while others put.

    Example:
        >>> queue = PointQueue()
        >>> queue.put("train", 0, None, 1.5, {"loss": 0.5})
        7
        >>> queue.encode(0, queue.end(), {})[0]["train"]
        ['{"step":0,"epoch":null,"time":1.500,"metrics":{"loss":0.5}}\\n']
    """

    __slots__ = ("_slots",)

    def __init__(self) -> None:
        self._slots: list[Any] = []

    def put(self, type_: str, step: int, epoch: int | float | None, time: float, metrics: dict[str, Any]) -> int:
        """Queue a checked point; returns the queue's size in slots (about 20 bytes each)."""
        slots = self._slots
        slots.extend((type_, len(metrics), step, epoch, time, *metrics, *metrics.values()))
        return len(slots)

    def end(self) -> int:
        """The position after the last point queued; also the queue's size in slots."""
        return len(self._slots)

    def advance(self, position: int) -> None:
        """Drop the points before ``position`` (a position :meth:`encode` returned)."""
        del self._slots[:position]

    def points(self) -> Iterator[tuple[str, int]]:
        """``(type, step)`` of each queued point, from a copy taken at the call."""
        slots = self._slots[:]  # copied in one step under the GIL: whole points
        i, end = 0, len(slots)
        while i < end:
            yield slots[i], slots[i + 2]
            i += _HEAD + 2 * slots[i + 1]

    def encode(
        self, start: int, end: int, last_steps: dict[str, int], limit: int = 1 << 62
    ) -> tuple[dict[str, list[str]], int, int]:
        """Text (whole lines) for the points from ``start`` to ``end``, by type, in order.

        Stops after the first run of points that brings the count to ``limit`` or more (a run
        is cut at ``limit``); returns the text, the position after the last point encoded and
        the number of points. ``time`` is written to the millisecond. ``last_steps`` (type ->
        highest step) is raised to the steps encoded.

        This is the writer thread's hot loop and it shares the GIL with training: consecutive
        points of one type and the same metric names (the usual case) are found with a few
        C-level slices, checked with one ``sum`` a metric and formatted with one cached
        %-template mapped over them, so no Python code runs per point.
        """
        buf = self._slots
        out: dict[str, list[str]] = {}
        i = start
        count = 0
        while i < end and count < limit:
            k = _run_length(buf, i, end, limit - count)
            type_, n = buf[i], buf[i + 1]
            stride = _HEAD + 2 * n
            hi = i + k * stride
            keys = tuple(buf[i + _HEAD : i + _HEAD + n])
            steps = buf[i + 2 : hi : stride]
            epochs = buf[i + 3 : hi : stride]
            times = buf[i + 4 : hi : stride]
            columns = [buf[j:hi:stride] for j in range(i + _HEAD + n, i + stride)]
            out.setdefault(type_, []).append(_encode_run(keys, steps, epochs, times, columns))
            top = max(steps)
            if top > last_steps.get(type_, -1):
                last_steps[type_] = top
            i = hi
            count += k
        return out, i, count


def encode_point(step: int, epoch: int | float | None, time: float, metrics: dict[str, Any]) -> str:
    """One JSON Lines record (with its newline) for a logged point."""
    queue = PointQueue()
    queue.put("", step, epoch, time, metrics)
    return queue.encode(0, queue.end(), {})[0][""][0]


def _template(keys: tuple[str, ...], with_epoch: bool) -> str:
    """A %-format for a point's step, epoch (when ``with_epoch``; else null), time and values."""
    fields = ",".join(strict_dumps(k).replace("%", "%%") + ":%r" for k in keys)
    epoch = "%s" if with_epoch else "null"
    return '{"step":%d,"epoch":' + epoch + ',"time":%.3f,"metrics":{' + fields + "}}\n"


_templates: dict[tuple[tuple[str, ...], bool], str] = {}


def _encode_run(
    keys: tuple[str, ...], steps: list[int], epochs: list[Any], times: list[float], columns: list[list[Any]]
) -> str:
    """The lines of a run of points with the same metric names, given column by column."""
    if not _all_finite(columns):
        # %r would write NaN and infinities as nan, inf and -inf, which JSON does not have.
        return _encode_careful(keys, steps, epochs, times, columns).replace('"epoch":None', '"epoch":null')
    with_epoch = epochs.count(None) != len(epochs)
    template = _templates.get((keys, with_epoch))
    if template is None:
        template = _template(keys, with_epoch)
        if len(_templates) < 1024:
            _templates[keys, with_epoch] = template
    if with_epoch:
        rows = zip(steps, epochs, times, *columns, strict=True)
        # %s wrote an epoch of None as None ('"epoch":None' cannot occur elsewhere: the quotes
        # of a metric name are escaped).
        return "".join(map(template.__mod__, rows)).replace('"epoch":None', '"epoch":null')
    return "".join(map(template.__mod__, zip(steps, times, *columns, strict=True)))


def _uniform(buf: list[Any], i: int, k: int, stride: int, type_: str, n: int, names: tuple[str, ...]) -> bool:
    """Whether the ``k`` points from ``buf[i]`` all have this type and these metric names.

    Sound even though the slices assume every point from ``i`` is ``stride`` slots long: the
    first point that differs starts where the slices expect it, so its type, count or a name
    fails the test.
    """
    hi = i + k * stride
    if buf[i:hi:stride].count(type_) != k or buf[i + 1 : hi : stride].count(n) != k:
        return False
    return all(buf[i + j : hi : stride].count(name) == k for j, name in enumerate(names, _HEAD))


def _run_length(buf: list[Any], i: int, end: int, limit: int) -> int:
    """How many consecutive points from ``buf[i]`` share its type and names (1 to ``limit``)."""
    type_, n = buf[i], buf[i + 1]
    names = tuple(buf[i + _HEAD : i + _HEAD + n])
    stride = _HEAD + 2 * n
    most = min((end - i) // stride, limit)
    if _uniform(buf, i, most, stride, type_, n, names):  # the usual case: one check, in C
        return most
    good, k = 1, 2  # gallop, then bisect between a length that passed and one that failed
    while k < most and _uniform(buf, i, k, stride, type_, n, names):
        good, k = k, 2 * k
    bad = min(k, most)
    while bad - good > 1:
        mid = (good + bad) // 2
        if _uniform(buf, i, mid, stride, type_, n, names):
            good = mid
        else:
            bad = mid
    return good


def _all_finite(columns: list[list[Any]]) -> bool:
    """Whether every value sums to a finite float, in C."""
    try:
        return all(math.isfinite(sum(column)) for column in columns)
    except OverflowError:  # ints whose sum is beyond a float
        return False


def _encode_careful(
    keys: tuple[str, ...], steps: list[int], epochs: list[Any], times: list[float], columns: list[list[Any]]
) -> str:
    """The lines of points some of which hold NaN or infinities, deciding point by point."""
    template = _template(keys, True)
    isfinite = math.isfinite
    lines = []
    for step, epoch, t, *values in zip(steps, epochs, times, *columns, strict=True):
        try:
            finite = isfinite(sum(values))
        except OverflowError:  # ints whose sum is beyond a float
            finite = False
        if finite:
            lines.append(template % (step, epoch, t, *values))
            continue
        metrics = encode_metrics(dict(zip(keys, values, strict=True)))
        lines.append(f'{{"step":{step},"epoch":{epoch},"time":{t:.3f},"metrics":{metrics}}}\n')
    return "".join(lines)
