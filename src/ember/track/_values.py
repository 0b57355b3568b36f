"""Metric validation, the JSON Lines encoding of a point, and reading metric files back.

A point is one ``Run.log`` call, stored as one line::

    {"step":500,"epoch":1,"time":1716200000.123456,"metrics":{"loss":0.31,"acc":"NaN"}}

JSON has no NaN or infinity, so non-finite values are stored as the strings ``"NaN"``,
``"Infinity"`` and ``"-Infinity"``; a metric value is otherwise always a JSON number, so a
string there can only mean one of these three. Readers turn them back into floats.
"""

from __future__ import annotations

import json
import math
import numbers
import operator
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ember.errors import TrackingError, describe, short_repr
from ember.track._fs import open_regular

TYPE_ALIASES: dict[str, str] = {
    "train": "train",
    "training": "train",
    "val": "val",
    "validate": "val",
    "validation": "val",
    "test": "test",
    "testing": "test",
    "eval": "test",
    "evaluate": "test",
    "evaluation": "test",
}
_TYPE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
# Filled by normalize_type: a type seen before is one dict look-up.
_TYPE_CACHE: dict[str, str] = {}
# Ints at least this large (in magnitude) are refused: their sum with floats, and many JSON
# readers, would overflow a float.
INT_LIMIT = 2**1023
strict_dumps = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode

Point = dict[str, Any]


def normalize_type(type_: object) -> str:
    """Map a metric type or alias to its stored name ('training' -> 'train').

    Raises:
        TrackingError: when ``type_`` is not a str that can name a metrics file.
    """
    if isinstance(type_, str):
        cached = _TYPE_CACHE.get(type_)
        if cached is not None:
            return cached
        canonical = TYPE_ALIASES.get(type_.lower())
        if canonical is None and _TYPE_RE.match(type_):
            canonical = type_
        if canonical is not None:
            if len(_TYPE_CACHE) < 4096:
                _TYPE_CACHE[type_] = canonical
            return canonical
    raise TrackingError(
        f"metric type {short_repr(type_)} is not allowed: use train/training, val/validate/validation, "
        "test/testing/eval/evaluate/evaluation, or a custom name of letters, digits, '_', '.' "
        "and '-' (at most 64, starting with a letter or digit), e.g. 'system'"
    )


def _bad_value(name: str, value: object, why: str = "") -> TrackingError:
    return TrackingError(
        f"metric {short_repr(name)} = {describe(value)} is not a number{why}; log a "
        "Python int/float, a NumPy scalar or a one-element tensor (bools are not numbers)"
    )


def _check_int(name: str, value: int) -> int:
    if -INT_LIMIT < value < INT_LIMIT:
        return value
    raise TrackingError(
        f"metric {short_repr(name)} = {short_repr(value)} is too large: log ints with -2**1023 < value < 2**1023"
    )


def _coerce_slow(name: str, value: Any, read_tensors: bool) -> int | float:
    """Coerce a value that is not a plain int/float, or raise TrackingError."""
    kind = type(value)
    module = kind.__module__
    if isinstance(value, bool):
        raise _bad_value(name, value)
    if kind is int:
        return _check_int(name, value)
    if module == "torch" or module.startswith("torch."):
        if not hasattr(value, "numel") or value.numel() != 1:
            shape = tuple(getattr(value, "shape", ()))
            raise _bad_value(name, value, f" but a tensor of shape {shape}")
        if value.dtype.is_complex or str(value.dtype) == "torch.bool":
            raise _bad_value(name, value, f" but a {value.dtype} tensor")
        if not read_tensors:
            return 0
        value = value.item()
        return float(value) if isinstance(value, float) else _check_int(name, int(value))
    if module == "numpy":
        size = getattr(value, "size", 1)
        dtype_kind = getattr(getattr(value, "dtype", None), "kind", "")
        if size != 1 or dtype_kind not in ("i", "u", "f"):
            raise _bad_value(name, value, " but a NumPy value of another kind or size")
        value = value.item()
        return float(value) if dtype_kind == "f" else int(value)
    if isinstance(value, numbers.Integral):
        return _check_int(name, int(value))
    if isinstance(value, numbers.Real):
        return float(value)
    raise _bad_value(name, value)


def coerce_metrics(metrics: object, read_tensors: bool = True, copy: bool = True) -> dict[str, int | float]:
    """Return a new dict of plain ints and floats, or raise TrackingError naming the bad entry.

    Tensors are read with ``.item()`` only when ``read_tensors`` (the no-op run checks their
    shape and dtype without a device sync). With ``copy=False`` a dict of plain values is
    returned itself, for a caller that is done with it before returning (``Run.log``).
    """
    if type(metrics) is dict and metrics:
        # Fast path: plain str -> float/int, checked in one pass and copied at C speed.
        for name, value in metrics.items():
            kind = type(value)
            if (
                type(name) is not str
                or not name
                or (kind is not float and (kind is not int or not -INT_LIMIT < value < INT_LIMIT))
            ):
                break
        else:
            return metrics.copy() if copy else metrics
    if not isinstance(metrics, Mapping):
        raise TrackingError(
            f"metrics must be a dict of name -> number, got {type(metrics).__name__}, e.g. metrics={{'loss': 0.31}}"
        )
    if not metrics:
        raise TrackingError("metrics is empty: pass at least one value, e.g. {'loss': 0.31}")
    out: dict[str, int | float] = {}
    for name, value in metrics.items():
        if type(name) is not str or not name:
            raise TrackingError(f"metric name {short_repr(name)} must be a non-empty str")
        kind = type(value)
        if kind is float or (kind is int and -INT_LIMIT < value < INT_LIMIT):
            out[name] = value
        else:
            out[name] = _coerce_slow(name, value, read_tensors)
    return out


def check_step(step: object) -> int:
    """Validate a step: a non-negative integer (NumPy and tensor integers accepted)."""
    if type(step) is int and step >= 0:
        return step
    value = -1
    if not isinstance(step, bool) and hasattr(step, "__index__"):
        try:
            value = operator.index(step)
        except TypeError:  # a tensor with more than one element, say
            value = -1
    if value < 0:
        raise TrackingError(f"step must be a non-negative int, got {short_repr(step)}, e.g. step=500")
    return value


def check_epoch(epoch: object) -> int | float | None:
    """Validate an epoch: None, a non-negative int or a finite non-negative float."""
    if epoch is None or (type(epoch) is int and epoch >= 0):
        return epoch
    if not isinstance(epoch, bool) and isinstance(epoch, numbers.Real):
        value = float(epoch) if not isinstance(epoch, numbers.Integral) else int(epoch)
        if math.isfinite(value) and value >= 0:
            return value
    raise TrackingError(f"epoch must be None or a non-negative number, got {short_repr(epoch)}")


def json_metrics(metrics: Mapping[str, int | float]) -> dict[str, int | float | str]:
    """``metrics`` with NaN and infinities as the strings the store writes (what strict JSON can hold)."""
    return {k: _nonfinite_to_str(v) for k, v in metrics.items()}


def _nonfinite_to_str(value: int | float) -> int | float | str:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    return value


def encode_metrics(metrics: Mapping[str, int | float]) -> str:
    """JSON for a metrics dict, with non-finite floats as "NaN"/"Infinity"/"-Infinity"."""
    try:
        return strict_dumps(metrics)
    except ValueError:
        return strict_dumps(json_metrics(metrics))


def _check_point(point: Any) -> Point:
    """``point`` when it has the shape ember writes, with the non-finite strings turned back into floats."""
    if type(point) is not dict:
        raise TypeError(f"a {type(point).__name__}, not an object")
    step, epoch, metrics = point["step"], point.get("epoch"), point["metrics"]
    if type(step) is not int or step < 0:
        raise ValueError(f"step {short_repr(step)} is not an int >= 0")
    if epoch is not None and (type(epoch) not in (int, float) or epoch < 0):
        raise ValueError(f"epoch {short_repr(epoch)} is not a number >= 0")
    if type(point.get("time", 0.0)) not in (int, float):
        raise ValueError(f"time {short_repr(point['time'])} is not a number")
    if type(metrics) is not dict:
        raise TypeError("metrics is not an object")
    for name, value in metrics.items():
        kind = type(value)
        if kind is str:
            metrics[name] = _NONFINITE[value]
        elif kind is not float and kind is not int:
            raise ValueError(f"metric {short_repr(name)} is {short_repr(value)}, not a number")
    return point


_DAMAGE = (ValueError, KeyError, TypeError, AttributeError, RecursionError)


def decode_point(line: bytes | str) -> Point:
    """Parse one record, turning the non-finite strings back into floats.

    Raises:
        ValueError, KeyError, TypeError: the line is not a record of the shape ember writes.
    """
    return _check_point(json.loads(line))


READ_CHUNK = 1 << 20
"""Bytes a metrics reader takes from the file at a time: what it holds besides the points it returns."""


def iter_point_batches(
    path: Path, offset: int = 0, chunk: int | None = None, end: int | None = None
) -> Iterator[tuple[list[Point], int]]:
    """The complete records of a metrics file from byte ``offset``, a chunk of the file at a time.

    Yields ``(points, cursor)``: the points of about ``chunk`` bytes and the byte offset just
    after them. Memory stays at one chunk whatever the file's size. A last line without its
    newline (torn by a crash or still being written) is not returned. A missing file yields
    nothing. With ``end`` (a cursor from an earlier pass), nothing after that byte is read:
    two passes over a file that is still growing see the same records.

    Raises:
        TrackingError: a complete line is not a valid record (the file was damaged), or the file
            is a link or not a regular file.
    """
    try:
        f = open_regular(path)
    except FileNotFoundError:
        return
    number, start = 0, offset
    chunk = chunk or READ_CHUNK
    with f:
        f.seek(offset)
        tail = b""
        position = offset  # the file's read position; offset: the cursor after the last complete line
        while True:
            data = f.read(chunk if end is None else min(chunk, end - position))
            if not data:
                return
            position += len(data)
            data = tail + data
            cut = data.rfind(b"\n") + 1
            tail = data[cut:]
            lines = [line for line in data[:cut].split(b"\n")[:-1] if line.strip()]
            try:  # one C call for the whole chunk; line by line only to find a damaged one
                points = [_check_point(p) for p in json.loads(b"[" + b",".join(lines) + b"]")]
            except _DAMAGE:
                points = []
                for i, line in enumerate(lines, start=number + 1):
                    try:
                        points.append(decode_point(line))
                    except _DAMAGE as e:
                        raise TrackingError(
                            f"{path}: record {i} after byte {start} is damaged ({type(e).__name__}: "
                            f"{short_repr(str(e), 200)}); move the file away or delete that line"
                        ) from None
            number += len(lines)
            offset += cut
            if cut:
                yield points, offset


def read_points(path: Path, offset: int = 0) -> tuple[list[Point], int]:
    """Read the complete records of a metrics file from byte ``offset``.

    A last line without its newline (torn by a crash or still being written) is not returned;
    the second value is the byte offset just after the last complete line, a cursor from which
    a later call (or an uploader) continues. For a long file, :func:`iter_point_batches` holds
    one chunk at a time instead of every point.

    Raises:
        TrackingError: when a complete line is not a valid record (the file was damaged).
    """
    points: list[Point] = []
    cursor = offset
    for batch, end in iter_point_batches(path, offset):
        points += batch
        cursor = end
    return points, cursor


def last_point(path: Path) -> Point | None:
    """The last complete record of a metrics file, reading only its tail; None when empty."""
    try:
        f = open_regular(path)
    except FileNotFoundError:
        return None
    window = 65536
    with f:
        size = os.fstat(f.fileno()).st_size
        while True:
            start = max(0, size - window)
            f.seek(start)
            data = f.read(size - start)
            end = data.rfind(b"\n")
            if end < 0:
                if start == 0:
                    return None
                window *= 4
                continue
            begin = data.rfind(b"\n", 0, end) + 1
            if begin == 0 and start > 0:
                window *= 4
                continue
            try:
                return decode_point(data[begin:end])
            except _DAMAGE as e:
                raise TrackingError(
                    f"{path}: the last record is damaged ({type(e).__name__}: {short_repr(str(e), 200)}); "
                    "move the file away or delete that line"
                ) from None
