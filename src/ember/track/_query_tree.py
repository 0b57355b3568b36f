"""The tree of ember's filter language (:mod:`ember.track.query`): conditions, errors, and how it reads a time."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, Literal

from ember.errors import TrackingError

Kind = Literal["hp", "m", "status", "label", "name", "start"]
AGGREGATES = ("last", "best", "min", "max")
STATUSES = ("Running", "Crashed", "Complete", "Failed", "Interrupted", "Preempted", "Damaged")
"""Every status a run can be listed with: run.json's, Crashed (its process is gone) and Damaged."""
FIELDS = ("status", "label", "name", "start")
ORDERING = ("<", "<=", ">", ">=")
OPS_OF: dict[str, tuple[str, ...]] = {
    "hp": ("=", "!=", *ORDERING, "~", "in", "not in"),
    "m": ("=", "!=", *ORDERING, "in", "not in"),
    "status": ("=", "!=", "in", "not in"),
    "label": ("=", "!=", "~", "in", "not in"),
    "name": ("=", "!=", *ORDERING, "~", "in", "not in"),
    "start": ORDERING,
}
MAX_CHARS, MAX_DEPTH, MAX_CONDITIONS = 10_000, 50, 200
"""The most a filter may hold: characters, parentheses and nots inside each other, conditions."""
MAX_KEY_DOTS = 4
"""An hparam key with more dots is read as fully nested or as one key, not every way between."""
NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", re.ASCII)
AGO = re.compile(r"(\d+(?:\.\d+)?)([smhdw])", re.ASCII)
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
WORD_END = frozenset(" \t\r\n\f\v()<>=!~,;\"'")
_TIME = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)(?:[T ](\d\d):(\d\d)(?::(\d\d)(?:\.\d+)?)?(?:(Z)|([+-])(\d\d):(\d\d))?)?",
    re.ASCII,
)


class FilterError(TrackingError):
    """A filter that cannot be read: ``column`` (1-based) points at the error in ``text``.

    ``str()`` is the one-line message; :meth:`pointer` adds the filter with a caret under the column.
    """

    def __init__(self, text: str, column: int, reason: str) -> None:
        self.text, self.column, self.reason = text, column, reason
        where = "at the end" if column > len(text) else f"at column {column}"
        super().__init__(f"filter not understood {where}: {reason}")

    def pointer(self) -> str:
        """The filter and a caret under the column of the error, two lines."""
        return f"{self.text}\n{' ' * (self.column - 1)}^"


@dataclass(frozen=True)
class Field:
    """What a condition reads: ``hp`` (``key``: the flattened hparam), ``m`` (``key``: ``TYPE/NAME``,
    ``agg``: last, best, min or max), ``status``, ``label``, ``name`` or ``start``."""

    kind: Kind
    key: str = ""
    agg: str = "last"

    def __str__(self) -> str:
        if self.kind == "hp":
            return "hp:" + _quoted_if_needed(self.key)
        if self.kind == "m":
            bare = _word(self.key) and self.key.rpartition(".")[2].lower() not in AGGREGATES
            name = self.key if bare else quote_text(self.key)
            return f"m:{name}" + ("" if self.agg == "last" else f".{self.agg}")
        return self.kind


@dataclass(frozen=True)
class Value:
    """A value as written: ``value`` typed (float, str, bool, None; int seconds for ``start``),
    ``text`` as typed (``~`` reads it; ``7d ago`` for a relative time) and whether it was quoted."""

    value: Any
    text: str
    quoted: bool = False

    def __str__(self) -> str:
        return quote_text(self.text) if self.quoted else self.text


@dataclass(frozen=True)
class Comparison:
    """One condition: ``field op values`` (one value, several for ``in``/``not in``)."""

    field: Field
    op: str
    values: tuple[Value, ...]
    column: int = dataclass_field(default=0, compare=False)

    def __str__(self) -> str:
        if self.op in ("in", "not in"):
            return f"{self.field} {self.op} ({', '.join(map(str, self.values))})"
        return f"{self.field} {self.op} {self.values[0]}"


@dataclass(frozen=True)
class And:
    """Every part holds."""

    parts: tuple[Node, ...]


@dataclass(frozen=True)
class Or:
    """Some part holds."""

    parts: tuple[Node, ...]


@dataclass(frozen=True)
class Not:
    """The part does not hold (the complement: runs without the field included)."""

    part: Node


Node = Comparison | And | Or | Not


def joined(kind: type[And] | type[Or], parts: list[Node]) -> Node | None:
    """``kind`` of the parts, flattened (an And inside an And is one And); one part: itself; none: None."""
    flat: list[Node] = []
    for p in parts:
        flat += p.parts if isinstance(p, kind) else [p]
    if not flat:
        return None
    return flat[0] if len(flat) == 1 else kind(tuple(flat))


def _word(text: str) -> bool:
    return bool(text) and not any(c in WORD_END or c.isspace() for c in text)


def quote_text(text: str) -> str:
    """``text`` as a quoted string of the language."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _quoted_if_needed(text: str) -> str:
    return text if _word(text) else quote_text(text)


# -- times: what the language reads as one, the same for both evaluators ------------------------------


def civil_seconds(y: Any, mo: Any, d: Any, h: Any, mi: Any, s: Any, div: Callable[[Any, Any], Any]) -> Any:
    """Seconds from 1970-01-01T00:00:00 to the given UTC time (year >= 1), in integer arithmetic.

    Written once for ints (``div`` = ``//``) and for SQL expressions (``div`` the database's
    integer division): every operand is >= 0, so truncating and flooring divisions agree. A day
    past the month's end runs on into the next month.
    """
    a = div(14 - mo, 12)  # 1 in January and February: the year is counted from March
    yy = y - a
    mp = mo + a * 12 - 3  # March is 0
    days = yy * 365 + div(yy, 4) - div(yy, 100) + div(yy, 400) + div(mp * 153 + 2, 5) + d - 1 - 719468
    return days * 86400 + h * 3600 + mi * 60 + s


def time_parts(text: Any) -> tuple[int, int, int, int, int, int, int] | None:
    """``(year, month, day, hour, minute, second, zone offset in seconds)`` of an ISO 8601 time the
    language reads (:data:`_TIME`, each part in range), or None."""
    if not isinstance(text, str):
        return None
    m = _TIME.fullmatch(text)
    if m is None:
        return None
    y, mo, d = int(m[1]), int(m[2]), int(m[3])
    h, mi, s = (int(m[i]) if m[i] else 0 for i in (4, 5, 6))
    zh, zm = (int(m[9]), int(m[10])) if m[8] else (0, 0)
    if not (y >= 1 and 1 <= mo <= 12 and 1 <= d <= 31 and h <= 23 and mi <= 59 and s <= 59 and zh <= 14 and zm <= 59):
        return None
    return y, mo, d, h, mi, s, (-1 if m[8] == "-" else 1) * (zh * 3600 + zm * 60)


def start_seconds(text: Any) -> int | None:
    """Whole seconds since 1970 (UTC) of an ISO 8601 time, None when the language does not read it.

    ``YYYY-MM-DD``, then optionally ``THH:MM`` (or a space), ``:SS``, ``.fraction`` (dropped) and a
    zone ``Z`` or ``+HH:MM`` (at most 14 hours, as the world's zones and SQLite); no zone is UTC.

    Example:
        >>> start_seconds("1970-01-02T01:00:00.9+01:00")
        86400
    """
    parts = time_parts(text)
    if parts is None:
        return None
    y, mo, d, h, mi, s, offset = parts
    return int(civil_seconds(y, mo, d, h, mi, s, lambda a, b: a // b)) - offset
