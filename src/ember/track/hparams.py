"""``Run.hparams``: a dict-like view that validates values and saves the run on each change."""

from __future__ import annotations

import copy
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ember.errors import TrackingError, describe, short_repr


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys: {'opt': {'lr': 1}} -> {'opt.lr': 1}.

    How hparams are shown and compared: ``ember runs show``/``compare``, the server's runs table,
    filters (``hp:opt.lr<0.1``) and the console's compare page.
    """
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def to_jsonable(value: Any, where: str) -> Any:
    """Return ``value`` as plain JSON data, or raise TrackingError naming ``where``.

    NumPy scalars and one-element tensors become Python numbers, tuples become lists; dict
    keys must be str and floats finite.
    """
    if value is None or type(value) in (bool, int, str):
        return value
    if isinstance(value, (bool, int, str)):  # IntEnum, StrEnum and friends
        return bool(value) if isinstance(value, bool) else _plain(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TrackingError(f"hparam {where!r} is {value}, which JSON cannot hold; use None or a str")
        return float(value)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TrackingError(f"hparam {short_repr(where)} has key {describe(key)}; keys must be str")
            out[key] = to_jsonable(item, f"{where}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [to_jsonable(item, f"{where}[{i}]") for i, item in enumerate(value)]
    module = type(value).__module__
    if module == "numpy" or module == "torch":
        size = getattr(value, "size", None)
        numel = value.numel() if hasattr(value, "numel") else size
        if numel == 1 and hasattr(value, "item"):
            return to_jsonable(value.item(), where)
    raise TrackingError(
        f"hparam {short_repr(where)} = {describe(value)} cannot be stored as JSON; "
        "pass a str, number, bool, None, list or dict (e.g. str(value))"
    )


def _plain(value: Any) -> Any:
    """An int or str subclass (IntEnum, StrEnum) as its plain built-in value."""
    return int(value) if isinstance(value, int) else str(value)


class HParams(Mapping[str, Any]):
    """Hyper-parameters of a run: read like a dict, change with ``[]=`` or :meth:`update`.

    Every change is validated first (JSON-serialisable values, str keys) and then saved to
    ``run.json``; a bad value raises :class:`~ember.errors.TrackingError` and changes nothing.
    Nested dicts are stored as copies: change them through ``update``.

    Example:
        >>> run.hparams.update({"lr": 0.1, "batch_size": 64})
        >>> run.hparams.update({"lr": 0.5}, override=False)  # keeps lr=0.1
        >>> run.hparams["lr"]
        0.1
    """

    def __init__(
        self,
        data: dict[str, Any],
        on_change: Callable[[], None],
        check_writable: Callable[[], None] | None = None,
        lock: threading.RLock | None = None,
    ) -> None:
        self._data = data
        self._on_change = on_change
        self._check_writable = check_writable
        # The run's writer thread saves run.json (heartbeat): changes happen under its lock.
        self._lock = lock or threading.RLock()

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"HParams({self._data!r})"

    def __setitem__(self, key: str, value: Any) -> None:
        self.update({key: value})

    def __delitem__(self, key: str) -> None:
        if self._check_writable is not None:
            self._check_writable()
        with self._lock:
            if key not in self._data:
                raise KeyError(key)
            del self._data[key]
            self._on_change()

    def update(self, new: Mapping[str, Any] | None = None, override: bool = True, **kwargs: Any) -> None:
        """Add hyper-parameters from ``new`` and keyword arguments.

        Args:
            new: a mapping of name -> JSON-serialisable value (None adds nothing).
            override: when False, names already present keep their value.
            **kwargs: more name -> value pairs.

        Raises:
            TrackingError: a key is not a str or a value is not JSON-serialisable; nothing
                is changed.
        """
        if self._check_writable is not None:
            self._check_writable()
        if new is not None and not isinstance(new, Mapping):
            raise TrackingError(f"hparams must be a dict, got {type(new).__name__}; e.g. {{'lr': 0.001}}")
        checked: dict[str, Any] = {}
        for key, value in {**(new or {}), **kwargs}.items():
            if not isinstance(key, str) or not key:
                raise TrackingError(f"hparam name {short_repr(key)} must be a non-empty str")
            checked[key] = to_jsonable(value, key)
        with self._lock:
            changed = False
            for key, value in checked.items():
                if not override and key in self._data:
                    continue
                self._data[key] = value
                changed = True
            if changed:
                self._on_change()

    def to_dict(self) -> dict[str, Any]:
        """A deep copy as a plain dict."""
        with self._lock:
            return copy.deepcopy(self._data)
