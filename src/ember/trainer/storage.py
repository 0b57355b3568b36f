"""What the Trainer remembers of a run: per-step scalars and per-epoch metrics.

* :class:`StepStorage` (``trainer.storage``) holds the last few values of per-step scalars
  (the loss, the learning rate, throughput). Values may be tensors: on an accelerator they are
  kept as given and only turned into Python numbers when someone reads them, so putting a loss
  every step costs no host-device synchronisation; on the CPU they are read at once
  (:func:`held`).
  Writers (the step logger, TensorBoard, tracking) read it, each through its own
  :class:`Cursor`: the values put since that writer's last write.
* :class:`History` (``trainer.history``) holds one value per epoch for each metric
  (``"train/loss"``, ``"test/accuracy"``), the latest value and the best one. It goes into
  checkpoints.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

import torch

from ember.errors import TrainerError

__all__ = ["Cursor", "History", "Mode", "Reduce", "Scalar", "StepStorage", "UnknownScalarError", "held"]

Scalar = float | int | torch.Tensor
"""A number, or a one-element tensor (read lazily)."""

Mode = Literal["min", "max"]

Reduce = Literal["latest", "mean"]
"""How :meth:`StepStorage.read_new` turns a scalar's new values into one number."""

_FOLD_EVERY = 128  # evicted values summed in one go (one host-device copy), for StepStorage(totals=True)


class UnknownScalarError(TrainerError, KeyError):
    """No scalar of that name was put in a :class:`StepStorage`.

    Also a ``KeyError``, as a mapping's missing key is: code that reads a scalar that may not
    exist yet (detectron2's writers do) catches it as one.
    """

    __str__ = Exception.__str__  # KeyError's would quote the whole message


def held(value: torch.Tensor) -> float | torch.Tensor:
    """How a per-step value is kept until it is read: a float on the CPU, a detached tensor elsewhere.

    Reading a CPU tensor waits for nothing, and keeping per-step tensors alive until a window or
    a sum lets them go costs more than the read (their memory is cold by then: about 3.5 µs a
    step for the loss alone on the tiny models, docs/performance.md); on an accelerator the read
    would make the host wait for the device, so the tensor is kept and read in bulk where it is
    logged. The step storage and the metric hooks keep their values this way.

    Args:
        value: a one-element tensor.

    Example:
        >>> held(torch.tensor(0.5))
        0.5
    """
    if value.is_cpu:
        return value.item()
    return value.detach() if value.requires_grad else value  # detaching again would only cost time


def _check_scalar(name: str, value: Any) -> Scalar:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TrainerError(
                f"scalar {name!r} must be a number or a one-element tensor, got a tensor of shape "
                f"{tuple(value.shape)}: reduce it (e.g. .mean()) first"
            )
        return held(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TrainerError(f"scalar {name!r} must be a number or a one-element tensor, got {type(value).__name__}")
    return value


def to_floats(values: Iterable[Scalar]) -> list[float]:
    """Python floats of ``values``, with one host-device copy per device for the tensors."""
    values = list(values)
    out: list[float] = [0.0] * len(values)
    by_device: dict[torch.device, list[int]] = {}
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            by_device.setdefault(v.device, []).append(i)
        else:
            out[i] = float(v)
    for device, idx in by_device.items():
        if len(idx) == 1 or device.type == "cpu":  # one copy each is no more: skip the stack (~8 us)
            for i in idx:
                out[i] = float(values[i].item())  # type: ignore[union-attr]
            continue
        stacked = torch.stack([values[i].reshape(()).to(torch.float64) for i in idx])  # type: ignore[union-attr]
        for i, f in zip(idx, stacked.tolist(), strict=True):
            out[i] = f
    return out


def _evict(evicted: dict[str, list[Any]], name: str, value: Scalar) -> None:
    """Count a value leaving the window into ``name``'s totals (summed 128 at a time)."""
    acc = evicted.setdefault(name, [0.0, 0, []])
    acc[2].append(value)
    if len(acc[2]) >= _FOLD_EVERY:
        acc[0] += sum(to_floats(acc[2]))
        acc[1] += len(acc[2])
        acc[2] = []


class StepStorage:
    """The last ``window`` values of each per-step scalar, tagged with the optimizer step.

    The Trainer sets :attr:`step` to ``trainer.cur_step`` after every iteration; hooks put
    values with :meth:`put_scalar` and logging hooks read them where they log.

    Args:
        window: how many recent values to keep per name.
        totals: also keep the sum and count of every value ever put, for :meth:`global_mean`
            (values leaving the window are summed 128 at a time, one host-device copy each).

    Example:
        >>> trainer.storage.put_scalar("train/loss", loss)        # a tensor: no sync here
        >>> trainer.storage.mean("train/loss", 20)                 # one sync, when logging
    """

    def __init__(self, window: int = 100, *, totals: bool = False) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise TrainerError(f"StepStorage window must be an int >= 1, got {window!r}")
        self.window = window
        self.step = 0
        """The step new values are tagged with (the Trainer keeps it at ``cur_step``)."""
        self._buffers: dict[str, deque[tuple[int, Scalar]]] = {}
        # name -> [sum of the folded evicted values, their count, evicted values not folded yet]
        self._evicted: dict[str, list[Any]] | None = {} if totals else None

    def put_scalar(self, name: str, value: Scalar, step: int | None = None) -> None:
        """Record ``value`` for ``name`` at ``step`` (default: :attr:`step`).

        A tensor on the CPU is read at once; elsewhere it is detached and kept as is (do not
        modify it in place afterwards): see :func:`held`.
        """
        if type(value) is not float:  # per step: a loss comes as the float LossHook read (held)
            value = _check_scalar(name, value)
        buf = self._buffers.get(name)
        if buf is None:
            buf = self._buffers[name] = deque(maxlen=self.window)
        elif self._evicted is not None and len(buf) == self.window:
            _evict(self._evicted, name, buf[0][1])
        buf.append((self.step if step is None else step, value))

    def put_scalars(self, step: int | None = None, **values: Scalar) -> None:
        """Record several scalars at once: ``storage.put_scalars(lr=0.1, grad_norm=norm)``."""
        for name, value in values.items():
            self.put_scalar(name, value, step)

    def _buffer(self, name: str) -> deque[tuple[int, Scalar]]:
        if name not in self._buffers:
            known = ", ".join(sorted(self._buffers)) or "none yet"
            raise UnknownScalarError(f"no scalar {name!r} was put in the step storage (known: {known})")
        return self._buffers[name]

    def latest(self, name: str) -> float:
        """The last value of ``name`` as a float."""
        return to_floats([self._buffer(name)[-1][1]])[0]

    def latest_step(self, name: str) -> int:
        """The step the last value of ``name`` was put at."""
        return self._buffer(name)[-1][0]

    def mean(self, name: str, window: int | None = None) -> float:
        """The mean of the last ``window`` values of ``name`` (all kept values by default)."""
        buf = self._buffer(name)
        items = list(buf)[-window:] if window else list(buf)
        values = to_floats(v for _, v in items)
        return sum(values) / len(values)

    def global_mean(self, name: str) -> float:
        """The mean of every value of ``name`` ever put, also those the window dropped.

        Raises:
            TrainerError: the storage was built without ``totals=True``.
        """
        buf = self._buffer(name)
        if self._evicted is None:
            raise TrainerError("this StepStorage keeps no totals: build it as StepStorage(totals=True)")
        folded, count, pending = self._evicted.get(name, (0.0, 0, []))
        recent = to_floats([*pending, *(v for _, v in buf)])
        return (folded + sum(recent)) / (count + len(recent))

    def values(self, name: str) -> list[tuple[int, float]]:
        """The kept ``(step, value)`` pairs of ``name``, oldest first."""
        buf = self._buffer(name)
        return list(zip((s for s, _ in buf), to_floats(v for _, v in buf), strict=True))

    def latest_all(self, names: Iterable[str] | None = None) -> dict[str, float]:
        """The last value of every scalar (or of ``names``), read with one sync per device."""
        keys = [n for n in (self._buffers if names is None else names) if n in self._buffers]
        return dict(zip(keys, to_floats(self._buffers[k][-1][1] for k in keys), strict=True))

    def read_new(self, cursor: Cursor, reduce: Reduce = "latest") -> dict[str, float]:
        """Each scalar put since ``cursor`` last read, as one number; moves ``cursor`` past them.

        A value counts as new by when it was put, not by its step tag: the micro-batches of an
        accumulation cycle are tagged with the step before the update they lead to, and they are
        new all the same. When more values were put than the window keeps, the kept ones count.

        Args:
            cursor: the reader's place (one per reader; a fresh one reads everything kept).
            reduce: ``"latest"``, the newest value; ``"mean"``, the mean of the new values.

        Returns:
            ``{name: value}`` for the names with new values, in first-put order; all the tensors
            are read with one host-device copy per device.

        Example:
            >>> cursor = Cursor()
            >>> storage.read_new(cursor, "mean")     # {"train/loss": 0.41, ...}
            >>> storage.read_new(cursor)             # {} until something new is put
        """
        if reduce not in ("latest", "mean"):
            raise TrainerError(f"read_new(reduce=...) takes 'latest' or 'mean', got {reduce!r}")
        names: list[str] = []
        values: list[Scalar] = []
        counts: list[int] = []
        marks, latest = cursor.marks, reduce == "latest"
        for name, buf in self._buffers.items():  # a buffer is made by its first put: never empty
            last, mark = buf[-1], marks.get(name)
            if last is mark:
                continue
            marks[name] = last
            names.append(name)
            if latest:
                values.append(last[1])
                continue
            n = 0
            for entry in reversed(buf):  # newest first, back to the entry last read (if still kept)
                if entry is mark:
                    break
                values.append(entry[1])
                n += 1
            counts.append(n)
        floats = to_floats(values)  # one read for every name
        if latest:
            return dict(zip(names, floats, strict=True))
        out: dict[str, float] = {}
        begin = 0
        for name, n in zip(names, counts, strict=True):
            out[name] = sum(floats[begin : begin + n]) / n
            begin += n
        return out

    def names(self) -> list[str]:
        """Names put so far, in first-put order."""
        return list(self._buffers)

    def __contains__(self, name: object) -> bool:
        return name in self._buffers

    def clear(self) -> None:
        """Forget every value."""
        self._buffers.clear()
        if self._evicted is not None:
            self._evicted.clear()


class Cursor:
    """A reader's place in a :class:`StepStorage`: the last value it read of each scalar.

    Give each writer its own; :meth:`StepStorage.read_new` reads what came after it. A cursor
    is not tied to one storage: read another one, and everything kept there is new.

    Example:
        >>> cursor = Cursor()
        >>> trainer.storage.read_new(cursor)
    """

    __slots__ = ("marks",)

    def __init__(self) -> None:
        self.marks: dict[str, tuple[int, Scalar]] = {}
        """name -> the entry last read (compared by identity: each put makes a new one)."""


class History:
    """One value per epoch for each metric, with the latest and the best.

    Metric hooks record into it at the end of each train and test epoch; names are
    ``"train/<metric>"`` and ``"test/<metric>"``. The first record of a name may give its
    ``mode`` (``"min"`` for losses, ``"max"`` for accuracies) so that :meth:`best` knows which
    way is better.

    Example:
        >>> trainer.history.latest("test/accuracy")
        0.97
        >>> trainer.history.best("test/loss"), trainer.history.best_epoch("test/loss")
        (0.08, 7)
        >>> trainer.history.values("train/loss")
        [0.9, 0.4, 0.2]
    """

    def __init__(self) -> None:
        self._values: dict[str, dict[int, float]] = {}
        self._modes: dict[str, Mode] = {}

    def record(self, name: str, value: Scalar, epoch: int, mode: Mode | None = None) -> None:
        """Set ``name``'s value for ``epoch`` (a second record for that epoch replaces the first).

        Args:
            name: the metric, e.g. ``"test/accuracy"``.
            value: a number or a one-element tensor (read now).
            epoch: the 0-based epoch it belongs to.
            mode: ``"min"`` or ``"max"``: which way is better (kept from the first record).
        """
        if mode is not None and mode not in ("min", "max"):
            raise TrainerError(f"metric mode must be 'min' or 'max', got {mode!r} for {name!r}")
        number = to_floats([_check_scalar(name, value)])[0]
        self._values.setdefault(name, {})[int(epoch)] = number
        if mode is not None:
            self._modes.setdefault(name, mode)

    def _series(self, name: str) -> dict[int, float]:
        if name not in self._values:
            raise TrainerError(f"no metric {name!r} in the history (known: {', '.join(self.names) or 'none yet'})")
        return self._values[name]

    @property
    def names(self) -> list[str]:
        """Metric names recorded so far."""
        return list(self._values)

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def values(self, name: str) -> list[float]:
        """``name``'s values in epoch order."""
        series = self._series(name)
        return [series[e] for e in sorted(series)]

    def epochs(self, name: str) -> list[int]:
        """The epochs ``name`` was recorded at, in order."""
        return sorted(self._series(name))

    def get(self, name: str, epoch: int) -> float | None:
        """``name``'s value at ``epoch``, or None when it was not recorded then."""
        return self._values.get(name, {}).get(epoch)

    def at(self, epoch: int) -> dict[str, float]:
        """Every metric recorded at ``epoch``."""
        return {n: s[epoch] for n, s in self._values.items() if epoch in s}

    def latest(self, name: str) -> float:
        """``name``'s value at the last epoch it was recorded."""
        series = self._series(name)
        return series[max(series)]

    def latest_epoch(self, name: str) -> int:
        """The last epoch ``name`` was recorded at."""
        return max(self._series(name))

    def mode(self, name: str) -> Mode | None:
        """``"min"``/``"max"`` as recorded for ``name``, or None when no hook said."""
        return self._modes.get(name)

    def _best(self, name: str, mode: Mode | None) -> tuple[int, float]:
        mode = mode or self._modes.get(name)
        if mode not in ("min", "max"):
            raise TrainerError(f"the history does not know if {name!r} is better high or low: pass mode='min' or 'max'")
        finite = [(e, v) for e, v in self._series(name).items() if not math.isnan(v)]
        if not finite:
            raise TrainerError(f"metric {name!r} has no value that is a number (all NaN)")
        sign = 1.0 if mode == "min" else -1.0
        return min(finite, key=lambda ev: (sign * ev[1], ev[0]))

    def best(self, name: str, mode: Mode | None = None) -> float:
        """The best value of ``name`` (NaN never counts), by ``mode`` or the recorded mode."""
        return self._best(name, mode)[1]

    def best_epoch(self, name: str, mode: Mode | None = None) -> int:
        """The first epoch at which ``name`` had its best value."""
        return self._best(name, mode)[0]

    def reset(self) -> None:
        """Forget every metric."""
        self._values.clear()
        self._modes.clear()

    def state_dict(self) -> dict[str, Any]:
        """Plain data (names, epochs, floats, modes) for checkpoints."""
        return {"values": {n: dict(s) for n, s in self._values.items()}, "modes": dict(self._modes)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace the history with what :meth:`state_dict` returned."""
        if "values" not in state:
            raise TrainerError("history state has no 'values': pass what History.state_dict() returned")
        self._values = {n: {int(e): float(v) for e, v in s.items()} for n, s in state["values"].items()}
        self._modes = dict(state.get("modes", {}))
