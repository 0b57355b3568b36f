"""The filter language of :mod:`ember.track.query` in SQL: the server's and ``ember ui``'s evaluator.

:func:`condition` turns a parsed filter into one WHERE clause on ``Run``, so the database
filters, counts and cuts the page (:func:`ember.server.services.listing.list_runs`); no run is read into
Python to be filtered. Every rule of the language is followed here as
:func:`ember.track.query.matches` follows it in Python (``tests/server/test_filter_equivalence.py``
runs the same filters through both), on SQLite and on PostgreSQL:

- each condition is two-valued (``CASE WHEN ... THEN true ELSE false END``), so a missing value
  makes it false and ``not`` is the complement, as in Python, never SQL's unknown;
- an hparam is read by the paths of :func:`~ember.track.query.key_paths` in their order, and
  its JSON type decides what it compares with (SQLite ``json_type``, PostgreSQL
  ``json_typeof``, on the stored text: no conversion to ``jsonb``); PostgreSQL compares JSON
  numbers as ``numeric`` (a JSON int too large for a float does not fail the query);
- a metric's last value is one probe of the points' primary key per run; its minimum and
  maximum come from the 128-step block summaries; "best" is the run's recorded mode
  (``run.json``'s ``metric_modes``), else the name rule;
- a start time's shape and ranges are checked before it is read (by SQLite's ``strftime``, or
  on PostgreSQL by the arithmetic of :func:`~ember.track.query.civil_seconds`, the language's
  own), so a hostile ``start_time`` is unreadable (false), never an error of the database;
- ``Crashed`` and ``Running``: the Running runs in scope whose process is gone
  (:func:`ember.server.services.liveness.crashed_runs`) are found first, in Python: as many as there are
  Running runs, not runs;
- text in order (``<``) by code point (PostgreSQL ``COLLATE "C"``); ``~`` folds only ASCII
  letters (SQLite's ``lower()``; PostgreSQL ``translate``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ColumnElement,
    Numeric,
    Select,
    Text,
    and_,
    case,
    cast,
    exists,
    false,
    func,
    literal,
    not_,
    null,
    or_,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import array
from sqlalchemy.orm import Session

from ember.server.storage.models import MetricBlock, MetricPoint, Run
from ember.track import query
from ember.track.best import metric_mode
from ember.track.query import And, Comparison, Evidence, Field, Node, Not, Or

_UPPER, _LOWER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz"
_PG_TIME = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?(Z|[+-][0-9]{2}:[0-9]{2})?)?$"
_D = "[0-9]"
_DATE, _HM = f"{_D * 4}-{_D * 2}-{_D * 2}", f"[T ]{_D * 2}:{_D * 2}"
_ORDER: dict[str, Callable[[Any, Any], ColumnElement[bool]]] = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


class Compiler:
    """Filters of one request in SQL: the dialect, and the Crashed runs once they are needed.

    Args:
        session: the request's session (its dialect decides the SQL).
        crashed: the primary keys of the Running runs in scope whose process is gone; called
            at most once, and only by a filter on ``status`` Running or Crashed.

    Example:
        >>> where = Compiler(session, lambda: set()).condition(query.parse("hp:lr < 0.01"))
        >>> session.scalars(select(Run.name).where(where))
    """

    def __init__(self, session: Session, crashed: Callable[[], set[int]]) -> None:
        self.pg = session.get_bind().dialect.name != "sqlite"
        self._find_crashed = crashed
        self._crashed: set[int] | None = None

    def condition(self, node: Node | None) -> ColumnElement[bool]:
        """The WHERE clause on ``Run`` of a filter (None: every run)."""
        if node is None:
            return true()
        if isinstance(node, And):
            return and_(*(self.condition(p) for p in node.parts))
        if isinstance(node, Or):
            return or_(*(self.condition(p) for p in node.parts))
        if isinstance(node, Not):
            return not_(self.condition(node.part))
        return _two_valued(self._comparison(node))

    def evidence(self, c: Comparison, scope: Select[Any], session: Session) -> Evidence:
        """What the condition ``c`` finds alone among the runs of ``scope`` (a select of ``Run.pk``), for
        :func:`ember.track.query.explain_empty`: a few queries, none of which reads a run into Python."""
        in_scope = Run.pk.in_(scope)
        count = select(func.count()).select_from(Run).where(in_scope)
        matching = session.scalar(count.where(self.condition(c))) or 0
        kind = c.field.kind
        if kind not in ("hp", "m"):
            return Evidence(matching, matching)
        having = session.scalar(count.where(_two_valued(self._has(c.field)))) or 0
        if kind == "hp":
            shown = self._hp_json(c.field.key)
            found = select(shown).where(in_scope, shown.is_not(None)).distinct().limit(9)
            return Evidence(having, matching, values=sorted(session.scalars(found)))
        value = self._metric(c.field)
        lo, hi = session.execute(select(func.min(value), func.max(value)).where(in_scope)).one()
        return Evidence(having, matching, span=None if lo is None else (lo, hi))

    def metric_value(self, fld: Field) -> ColumnElement[Any]:
        """The value a condition on the metric field ``fld`` compares, per ``Run`` of the outer query: its
        last, minimum, maximum or best value; NULL for NaN or none (what the runs table sorts by)."""
        return self._metric(fld)

    # -- one condition ------------------------------------------------------------------------------------

    def _comparison(self, c: Comparison) -> ColumnElement[bool]:
        kind = c.field.kind
        if kind == "hp":
            return self._hparam(c)
        if kind == "label":
            return self._label(c)
        if kind == "status":
            found = or_(*(self._status_is(v.value) for v in c.values))
            return not_(found) if c.op in ("!=", "not in") else found
        if kind == "m":
            value: Any = self._metric(c.field)
        elif kind == "start":
            value = self._start_seconds()
        else:
            value = Run.name
        if c.op == "~":
            return self._contains(value, c.values[0].text)
        if c.op in _ORDER:
            ordered = value.collate("C") if self.pg and kind == "name" else value
            return _ORDER[c.op](ordered, c.values[0].value)
        equal = or_(*(value == v.value for v in c.values))
        return and_(value.is_not(None), not_(equal)) if c.op in ("!=", "not in") else equal

    def _contains(self, text: ColumnElement[Any], part: str) -> ColumnElement[bool]:
        if self.pg:
            return func.strpos(func.translate(text, _UPPER, _LOWER), query.fold(part)) > 0
        return func.instr(func.lower(text), query.fold(part)) > 0

    # -- hparams ------------------------------------------------------------------------------------------

    def _readable(self, column: Any) -> ColumnElement[bool]:
        """The JSON column can be read on this row (a row stored before the API refused NaN or ``\\u0000`` cannot)."""
        if self.pg:
            return func.strpos(cast(column, Text), "\\u0000") == 0
        return func.json_valid(column) == 1

    def _typed(self, column: Any, path: tuple[str, ...]) -> tuple[ColumnElement[Any], ColumnElement[Any]]:
        """The JSON type and the value at ``path`` in a JSON column; type NULL where nothing is there.

        Types are named as SQLite names them on both databases: integer/real as ``number``,
        ``text``, ``true``, ``false``, ``null``, ``array``, ``object``."""
        if self.pg:  # the json operators, which read the stored text: no conversion of it to jsonb
            where = array(list(path), type_=Text)
            kind = func.json_typeof(column.op("#>", return_type=JSON)(where))
            text = column.op("#>>", return_type=Text)(where)
            named = case(
                (kind == "string", "text"),
                (kind == "boolean", case((text == "true", "true"), else_="false")),
                else_=kind,
            )
            return named, text
        at = _sqlite_path(path)
        kind = func.json_type(column, at)
        return case((kind.in_(("integer", "real")), "number"), else_=kind), func.json_extract(column, at)

    def _chosen(self, key: str, then: Callable[[Any, Any, tuple[str, ...]], Any], missing: Any) -> ColumnElement[Any]:
        """``then(type, value, path)`` at the first path of ``key`` that reaches a value that is not an
        object (:func:`ember.track.query.lookup`); ``missing`` when none does."""
        whens: list[tuple[Any, Any]] = [(not_(self._readable(Run.hparams)), missing)]
        for path in query.key_paths(key):
            kind, value = self._typed(Run.hparams, path)
            whens.append((and_(kind.is_not(None), kind != "object"), then(kind, value, path)))
        return case(*whens, else_=missing)

    def _hparam(self, c: Comparison) -> ColumnElement[bool]:
        return self._chosen(c.field.key, lambda kind, value, _: _two_valued(self._hp_holds(c, kind, value)), false())

    def _hp_holds(self, c: Comparison, kind: Any, value: Any) -> ColumnElement[bool]:
        """Whether an hparam of JSON type ``kind`` and value ``value`` (present) satisfies ``c``."""
        if c.op == "~":
            return and_(kind == "text", self._contains(value, c.values[0].text))
        if c.op in _ORDER:
            wanted = c.values[0].value
            if query.kind_of(wanted) == "number":
                return and_(kind == "number", _ORDER[c.op](self._number(value), self._number_literal(wanted)))
            if query.kind_of(wanted) == "string":
                text = cast(value, Text).collate("C") if self.pg else cast(value, Text)
                return and_(kind == "text", _ORDER[c.op](text, wanted))
            return false()
        equal = or_(*(self._hp_equals(kind, value, v.value) for v in c.values))
        return not_(equal) if c.op in ("!=", "not in") else equal

    def _hp_equals(self, kind: Any, value: Any, wanted: Any) -> ColumnElement[bool]:
        found = query.kind_of(wanted)
        if found == "number":
            return and_(kind == "number", self._number(value) == self._number_literal(wanted))
        if found == "string":
            return and_(kind == "text", cast(value, Text) == wanted)
        if found == "bool":
            return kind == ("true" if wanted else "false")
        return kind == "null"

    def _number(self, value: Any) -> ColumnElement[Any]:
        return cast(value, Numeric) if self.pg else value

    def _number_literal(self, wanted: float) -> Any:
        # The shortest decimal that reads back as the float: it orders as the float does among
        # the JSON numbers, which the server writes the same way.
        return literal(Decimal(repr(wanted)), Numeric) if self.pg else wanted

    def _has(self, fld: Field) -> ColumnElement[bool]:
        """The run has the hparam (a value that is not an object) or the metric (any point)."""
        if fld.kind == "hp":
            return self._chosen(fld.key, lambda *_: true(), false())
        type_, _, name = fld.key.partition("/")
        b = MetricBlock
        return exists().where(b.run_pk == Run.pk, b.type == type_, b.name == name)

    def _hp_json(self, key: str) -> ColumnElement[Any]:
        """The hparam ``key`` as JSON text (``"adam"``, ``0.1``, ``true``); NULL where the run has none."""

        def shown(kind: Any, value: Any, path: tuple[str, ...]) -> Any:
            if self.pg:
                return cast(Run.hparams.op("#>", return_type=JSON)(array(list(path), type_=Text)), Text)
            as_json = func.json_quote(func.json_extract(Run.hparams, _sqlite_path(path)))
            return case((kind.in_(("true", "false", "null")), kind), else_=as_json)

        return self._chosen(key, shown, null())

    # -- metrics, status, labels, start --------------------------------------------------------------------

    def _metric(self, fld: Field) -> ColumnElement[Any]:
        """A metric's last, minimum, maximum or best value per run; NULL for NaN or none."""
        type_, _, name = fld.key.partition("/")
        p, b = MetricPoint, MetricBlock
        if fld.agg == "last":
            at = (p.run_pk == Run.pk, p.type == type_, p.name == name)
            return select(p.value).where(*at).order_by(p.step.desc()).limit(1).scalar_subquery()
        at_b = (b.run_pk == Run.pk, b.type == type_, b.name == name)
        low = select(func.min(b.min_value)).where(*at_b).scalar_subquery()
        high = select(func.max(b.max_value)).where(*at_b).scalar_subquery()
        if fld.agg != "best":
            return low if fld.agg == "min" else high
        mode = self._recorded_mode(fld.key)
        default = high if metric_mode(fld.key) == "max" else low
        return case((mode == "max", high), (mode == "min", low), else_=default)

    def _recorded_mode(self, key: str) -> ColumnElement[Any]:
        """The mode ``run.json`` records for the metric ``key`` (``metric_modes``), NULL when none."""
        recorded: Any
        if self.pg:
            recorded = Run.meta.op("->", return_type=JSON)("metric_modes").op("->>", return_type=Text)(key)
        else:
            entries = func.json_each(Run.meta, "$.metric_modes").table_valued("key", "value")
            recorded = select(entries.c.value).where(entries.c.key == key).limit(1).scalar_subquery()
        return case((self._readable(Run.meta), recorded), else_=null())

    def _status_is(self, status: str) -> ColumnElement[bool]:
        if status not in ("Running", "Crashed"):
            return Run.status == status
        if self._crashed is None:
            self._crashed = self._find_crashed()
        gone = Run.pk.in_(sorted(self._crashed)) if self._crashed else false()
        return gone if status == "Crashed" else and_(Run.status == "Running", not_(gone))

    def _label(self, c: Comparison) -> ColumnElement[bool]:
        if self.pg:
            is_list = and_(self._readable(Run.labels), func.json_typeof(Run.labels) == "array")
            entries = func.json_array_elements_text(case((is_list, Run.labels), else_=cast("[]", JSON)))
            each = entries.table_valued("value").render_derived()
        else:
            is_list = and_(self._readable(Run.labels), func.json_type(Run.labels) == "array")
            each = func.json_each(case((is_list, Run.labels), else_="[]")).table_valued("value")
        if c.op == "~":
            return exists().where(self._contains(each.c.value, c.values[0].text)).select_from(each)
        found = exists().where(each.c.value.in_([v.value for v in c.values])).select_from(each)
        return not_(found) if c.op in ("!=", "not in") else found

    def _start_seconds(self) -> ColumnElement[Any]:
        return _start_seconds(self.pg)


@functools.cache
def _start_seconds(pg: bool) -> ColumnElement[Any]:
    """``Run.start_time`` in whole seconds since 1970 (:func:`ember.track.query.start_seconds`), else NULL.

    The shapes and ranges the language reads are checked first. SQLite then reads the time without
    its fraction (``strftime('%s')``, which rounds a fraction to milliseconds: 59.9999995 would
    be the next second): the same numbers as the language's arithmetic for every time that passes,
    a day past the month's end included, and NULL for a month, day, minute, second or zone out of
    range; PostgreSQL, whose casts fail a whole query on a bad time, runs the arithmetic. Built
    once per dialect: an expression is not changed by its use.
    """
    x = Run.start_time
    size = func.length(x)
    has_zone = and_(size >= 22, func.substr(x, size - 5, 1).in_(("+", "-")), func.substr(x, size - 2, 1) == ":")
    has_z = and_(size >= 17, func.substr(x, size, 1) == "Z")
    body = case((has_zone, size - 6), (has_z, size - 1), else_=size)
    if not pg:
        head = func.substr(x, 1, body)
        shaped = or_(
            and_(body == 10, _glob(head, _DATE), not_(has_zone), not_(has_z)),
            and_(body == 16, _glob(head, _DATE + _HM)),
            and_(body == 19, _glob(head, f"{_DATE}{_HM}:{_D * 2}")),
            and_(
                body >= 21, _glob(head, f"{_DATE}{_HM}:{_D * 2}.{_D}*"), not_(_glob(func.substr(head, 21), "*[^0-9]*"))
            ),
        )
        # SQLite reads 24:00 and year 0 too, and zones up to 14 hours (the language's limit).
        in_range = and_(func.substr(x, 1, 4) != "0000", or_(body < 16, func.substr(x, 12, 2) <= "23"))
        whole = case((body > 19, func.substr(x, 1, 19).concat(func.substr(x, body + 1))), else_=x)
        seconds = cast(func.strftime("%s", whole), BigInteger)  # without the fraction, which SQLite rounds
        return case((x.is_(None), null()), (not_(shaped), null()), (not_(in_range), null()), else_=seconds)

    def part(start: Any, length: int, when: Any = None) -> ColumnElement[Any]:
        value = cast(func.substr(x, start, length), BigInteger)
        return value if when is None else case((when, value), else_=cast(literal(0), BigInteger))

    y, mo, d = part(1, 4), part(6, 2), part(9, 2)
    h, mi, s = part(12, 2, body >= 16), part(15, 2, body >= 16), part(18, 2, body >= 19)
    zh, zm = part(size - 4, 2, has_zone), part(size - 1, 2, has_zone)
    sign = case((func.substr(x, size - 5, 1) == "-", -1), else_=1)
    in_range = and_(y >= 1, mo >= 1, mo <= 12, d >= 1, d <= 31, h <= 23, mi <= 59, s <= 59, zh <= 14, zm <= 59)
    seconds = query.civil_seconds(y, mo, d, h, mi, s, lambda a, b: a // b) - sign * (zh * 3600 + zm * 60)
    return case(
        (x.is_(None), null()), (not_(x.regexp_match(_PG_TIME)), null()), (not_(in_range), null()), else_=seconds
    )


def _glob(text: Any, pattern: str) -> ColumnElement[bool]:
    """SQLite's ``text GLOB pattern``."""
    return text.op("GLOB", is_comparison=True)(pattern)


def _sqlite_path(path: tuple[str, ...]) -> str:
    """A JSON path for SQLite's functions: every key quoted (the parser refused keys holding a ``"``)."""
    return "$" + "".join(f'."{part}"' for part in path)


def _two_valued(cond: ColumnElement[bool]) -> ColumnElement[bool]:
    """``cond`` with unknown (NULL) read as false: ``not`` of it is then the complement."""
    return case((cond, true()), else_=false())


def field_keys(node: Node | None, kind: str) -> list[str]:
    """The hparam keys (``kind="hp"``) or metrics (``"m"``) a filter reads, each once, as written."""
    return list(dict.fromkeys(c.field.key for c in query.comparisons(node) if c.field.kind == kind))
