"""The filter language of ``ember runs ls --filter``, the server's ``/api/v1/search/runs`` and the console's runs table.

One parser (:func:`parse`) turns a filter into a tree; two evaluators read the same tree: this
module's :func:`matches` in Python (the local store, ``ember runs ls``) and
:mod:`ember.server.services.filtering` in SQL (the server and ``ember ui``). Both follow the rules below,
and ``tests/server/test_filter_equivalence.py`` runs the same filters through both over the same
runs.

A filter is conditions joined by ``and``, ``or``, ``not`` and parentheses (``not`` binds
tightest, then ``and``, then ``or``); ``;`` or ``,`` between whole conditions also means "and",
as the console's ``hp:lr>=0.01; m:val/acc>0.9`` always did. A condition is a field, an operator
and a value::

    hp:lr < 0.01                        a hyper-parameter; nested ones with dots: hp:opt.beta >= 0.9
    hp:optimizer in (adam, adamw)       in (...) / not in (...): equal to one of them / to none
    m:val/acc > 0.9                     a metric's last value (at its highest step)
    m:val/acc.best > 0.9                .last .best .min .max ("best": the run's recorded mode, else
                                        the name rule of ember.track.best)
    status = Crashed                    Running Crashed Complete Failed Interrupted Preempted Damaged
    label = baseline                    the run has that label (label != x: it has not)
    name ~ resnet                       contains, ignoring the case of ASCII letters
    start >= 2026-11-01                 ISO 8601 times (no zone: UTC), or start > 7d ago (s m h d w)

Operators: ``= != < <= > >=``, ``~`` (contains) and ``in``/``not in``. A value is a number, a
word, ``true``/``false``/``null``, or a quoted string (``"resnet 50"``, needed for spaces and
for ``( ) , ; = < > ! ~``); a quoted key reaches an odd name: ``hp:"batch size"``, and
``m:"val/acc.best"`` is a metric named ``acc.best`` (``m:"val/acc.best".max``: its maximum).

How values compare (the same in both evaluators):

- A value is compared with a literal of its own kind only: numbers with numbers (``true`` is
  not 1), strings with strings (``hp:seed="42"`` matches the string, ``hp:seed=42`` the
  number; ``<`` on strings is by code point), booleans and ``null`` with ``=``/``!=``.
- A condition on something a run does not have (no such hparam, a metric never logged, or
  whose value is NaN) is false, ``!=`` included; ``not`` is the complement:
  ``not hp:opt = adam`` matches the runs without ``opt`` too, ``hp:opt != adam`` does not.
- ``!=``/``not in`` on a value of another kind is true (``"auto" != 0.1``).
- An hparam key ``a.b.c`` is the flattened key the runs table shows: the nested value
  ``{"a": {"b": {"c": ...}}}`` first, then the other ways of reading the dots (``{"a.b":
  {"c": ...}}``...), the whole key last (:func:`key_paths`); an object is not a value.
- Times are compared to the second (a fraction is dropped); the day of the month may run past
  the month's end as SQLite reads it (2026-02-30 is 2026-03-02), :func:`start_seconds`.

Every input that cannot be read raises :class:`FilterError`, which names the column of the
error and what would be right.

Example:
    >>> tree = parse("m:val/acc.best > 0.9 and (hp:lr < 1e-3 or hp:opt in (adam, sgd))")
    >>> render(tree)
    'm:val/acc.best > 0.9 and (hp:lr < 1e-3 or hp:opt in (adam, sgd))'
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ember.errors import TrackingError, short_repr
from ember.track._query_syntax import read, read_field
from ember.track._query_tree import (
    AGGREGATES,
    FIELDS,
    MAX_KEY_DOTS,
    ORDERING,
    STATUSES,
    And,
    Comparison,
    Field,
    FilterError,
    Node,
    Not,
    Or,
    Value,
    civil_seconds,
    joined,
    quote_text,
    start_seconds,
    time_parts,
)
from ember.track.best import Mode, metric_mode

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def quote(value: str) -> str:
    """``value`` as a string literal of the language (always quoted), e.g. for a label from a form.

    Example:
        >>> quote('say "hi"')
        '"say \\\\"hi\\\\""'
    """
    return quote_text(value)


def parse(text: str, now: float | None = None) -> Node | None:
    """The tree of a filter; None for an empty one (no condition: every run).

    Args:
        text: e.g. ``'hp:lr < 0.01 and m:val/acc.best > 0.9'`` (see the module).
        now: the time ``7d ago`` counts back from (default: now).

    Raises:
        FilterError: what cannot be read, with its column.

    Example:
        >>> render(parse("status = crashed or label = flaky"))
        'status = Crashed or label = flaky'
    """
    if not isinstance(text, str):
        raise TrackingError(f"a filter is text, got {short_repr(text)}")
    return read(text, time.time() if now is None else now)


def parse_field(text: str) -> Field:
    """One field of the language, as a sort names it: ``m:val/acc.best`` (a metric's best; ``.last``,
    ``.min``, ``.max``), ``hp:opt.lr``, ``name``...

    Raises:
        FilterError: what cannot be read as one field, with its column.

    Example:
        >>> parse_field("m:val/acc.best")
        Field(kind='m', key='val/acc', agg='best')
    """
    if not isinstance(text, str):
        raise TrackingError(f"a field is text, got {short_repr(text)}")
    return read_field(text)


def order_key(value: Any) -> tuple[int, Any] | None:
    """How a sort orders a value, the runs table's and ``ember runs ls --sort``'s: numbers (booleans as
    0/1), then text; None for what is missing or NaN, which both sort last whichever the direction.

    Example:
        >>> sorted([0.1, "auto", 2], key=order_key)
        [0.1, 2, 'auto']
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, bool | int | float):
        return (0, float(value))
    return (1, str(value))


def parse_all(texts: Iterable[str], now: float | None = None) -> Node | None:
    """The ``and`` of several filters (the API's repeated ``where``, ``--filter`` twice); None when all are empty."""
    at = time.time() if now is None else now
    return all_of(parse(text, at) for text in texts)


def all_of(parts: Iterable[Node | None]) -> Node | None:
    """The ``and`` of filter trees (None ones left out); None when there is none."""
    return joined(And, [p for p in parts if p is not None])


def render(node: Node) -> str:
    """A filter's canonical text (``parse(render(t)) == t``): operators spaced, values quoted where needed."""
    if isinstance(node, Comparison):
        return str(node)
    if isinstance(node, Not):
        inner = render(node.part)
        return f"not {inner}" if isinstance(node.part, Comparison | Not) else f"not ({inner})"
    word = " and " if isinstance(node, And) else " or "
    return word.join(render(p) if not isinstance(p, And | Or) else f"({render(p)})" for p in node.parts)


def comparisons(node: Node | None) -> list[Comparison]:
    """Every condition of a tree, each once, in the order written."""
    out: dict[Comparison, None] = {}

    def walk(n: Node) -> None:
        if isinstance(n, Comparison):
            out.setdefault(n)
        elif isinstance(n, Not):
            walk(n.part)
        else:
            for p in n.parts:
                walk(p)

    if node is not None:
        walk(node)
    return list(out)


# -- what the values mean: one definition for both evaluators --------------------------------------------


def key_paths(key: str) -> list[tuple[str, ...]]:
    """The ways to read the flattened hparam key ``key`` as a path into nested hparams, in the order tried.

    ``"a.b.c"``: ``(a, b, c)``, ``(a, b.c)``, ``(a.b, c)``, ``(a.b.c,)``: most nested first,
    the whole key last. A key with more than :data:`MAX_KEY_DOTS` dots: the first and the last only.

    Example:
        >>> key_paths("opt.lr")
        [('opt', 'lr'), ('opt.lr',)]
    """
    parts = key.split(".")
    gaps = len(parts) - 1
    if gaps > MAX_KEY_DOTS:
        return [tuple(parts), (key,)]
    paths = []
    for mask in range((1 << gaps) - 1, -1, -1):  # bit i set: a split after part i
        path, current = [], parts[0]
        for i in range(gaps):
            if mask >> (gaps - 1 - i) & 1:
                path.append(current)
                current = parts[i + 1]
            else:
                current += "." + parts[i + 1]
        paths.append((*path, current))
    return paths


def lookup(hparams: Any, key: str) -> tuple[bool, Any]:
    """``(True, value)`` at the first of :func:`key_paths` reaching a non-object value, else ``(False, None)``."""
    for path in key_paths(key):
        node = hparams
        for part in path:
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            if not isinstance(node, dict):
                return True, node
    return False, None


def fold(text: str) -> str:
    """``text`` with ASCII letters in lower case, the others as they are (what ``~`` compares; SQLite's lower())."""
    return text.translate(_ASCII_LOWER)


def kind_of(value: Any) -> str:
    """How a value compares: ``number`` (int, float; not bool), ``string``, ``bool``, ``null`` or ``other``."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "null" if value is None else "other"


# -- the Python evaluator ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricFacts:
    """One metric of one run: its value at its highest step, its minimum and maximum (NaN left out:
    None when absent or NaN), and the mode "best" follows for it."""

    last: float | None
    min: float | None
    max: float | None
    mode: Mode

    def value(self, agg: str) -> float | None:
        """``last``, ``min``, ``max`` or ``best`` (the minimum or maximum by :attr:`mode`)."""
        if agg == "best":
            agg = self.mode
        found: float | None = getattr(self, agg)
        return found


@dataclass(frozen=True)
class RunFacts:
    """What a filter reads of one run (:func:`matches`); ``metrics`` needs only those the filter names."""

    name: str
    status: str
    labels: tuple[str, ...]
    start_time: Any
    hparams: Mapping[str, Any]
    metrics: Mapping[str, MetricFacts]


def metric_facts(key: str, last: Any, lo: Any, hi: Any, recorded: Mapping[str, Any]) -> MetricFacts:
    """:class:`MetricFacts` with NaN as None and the mode the run recorded for ``key``, else the name rule."""
    mode = recorded.get(key)
    return MetricFacts(
        _number(last), _number(lo), _number(hi), metric_mode(key, mode if mode in ("min", "max") else None)
    )


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return None if isinstance(value, float) and math.isnan(value) else value


def matches(node: Node | None, run: RunFacts) -> bool:
    """Whether ``run`` satisfies the filter (None: every run does).

    Example:
        >>> matches(parse("hp:lr < 0.01"), RunFacts("r", "Complete", (), None, {"lr": 0.001}, {}))
        True
    """
    if node is None:
        return True
    if isinstance(node, And):
        return all(matches(p, run) for p in node.parts)
    if isinstance(node, Or):
        return any(matches(p, run) for p in node.parts)
    if isinstance(node, Not):
        return not matches(node.part, run)
    return _holds(node, run)


def _holds(c: Comparison, run: RunFacts) -> bool:
    kind, op = c.field.kind, c.op
    if kind == "label":
        if op == "~":
            return any(fold(c.values[0].text) in fold(label) for label in run.labels)
        found = any(v.value in run.labels for v in c.values)
        return not found if op in ("!=", "not in") else found
    if kind == "hp":
        present, value = lookup(run.hparams, c.field.key)
    elif kind == "m":
        facts = run.metrics.get(c.field.key)
        value = None if facts is None else facts.value(c.field.agg)
        present = value is not None
    elif kind == "start":
        value = start_seconds(run.start_time)
        present = value is not None
    else:
        value, present = (run.name if kind == "name" else run.status), True
    if not present:
        return False
    if op == "~":
        return isinstance(value, str) and fold(c.values[0].text) in fold(value)
    if op in ORDERING:
        wanted = c.values[0].value
        comparable = kind_of(value) == kind_of(wanted) and kind_of(value) in ("number", "string")
        return comparable and _ORDER[op](value, wanted)
    equal = any(kind_of(value) == kind_of(v.value) and value == v.value for v in c.values)
    return not equal if op in ("!=", "not in") else equal


_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def select(node: Node | None, runs: Iterable[RunFacts]) -> Iterator[RunFacts]:
    """The runs that satisfy the filter, in their order."""
    return (r for r in runs if matches(node, r))


def metrics_named(node: Node | None) -> list[str]:
    """The metrics (``TYPE/NAME``) a filter reads, each once."""
    return list(dict.fromkeys(c.field.key for c in comparisons(node) if c.field.kind == "m"))


# -- why nothing matched ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    """What one condition finds among the runs in scope, for :func:`explain_empty`.

    ``having``: runs that have the field (an hparam key, a metric); ``matching``: runs the
    condition alone matches; ``values``: for an hparam, the values there are (JSON text, up to 9);
    ``span``: for a metric, its lowest and highest value there.
    """

    having: int
    matching: int
    values: Sequence[str] = ()
    span: tuple[float, float] | None = None


def explain_empty(node: Node, evidence: Callable[[Comparison], Evidence]) -> list[str]:
    """Why a filter matched no run, one sentence per reason, from what each condition finds alone.

    Only conditions that must hold for a run to match are blamed (not one under ``not``): a key
    no run has is named; a condition no run meets says what there is instead (an hparam's
    values, a metric's range). When none of them is to blame, every condition is counted, so
    that "0 runs" is never pinned on a value that exists.

    Example:
        >>> explain_empty(parse("hp:lrr > 0.1"), lambda c: Evidence(0, 0))
        ["no run here has the hyper-parameter 'lrr' (nested ones are written as opt.lr)"]
    """
    out: list[str] = []
    counts: list[str] = []
    for c, positive in _polarities(node):
        ev = evidence(c)
        key = c.field.key
        if positive and c.field.kind == "hp" and ev.having == 0:
            out.append(f"no run here has the hyper-parameter {key!r} (nested ones are written as opt.lr)")
        elif positive and c.field.kind == "m" and ev.having == 0:
            out.append(f"no run here has the metric {key!r} (write it as TYPE/NAME, e.g. val/acc)")
        elif positive and ev.matching == 0 and c.field.kind == "hp":
            more = ", ..." if len(ev.values) > 8 else ""
            out.append(f"no run matches {c}: {key} here is one of {', '.join(ev.values[:8])}{more}")
        elif positive and ev.matching == 0 and c.field.kind == "m" and ev.span is not None:
            lo, hi = (f"{v:.6g}" for v in ev.span)
            out.append(f"no run matches {c}: {c.field} here runs from {lo} to {hi}")
        elif positive and ev.matching == 0:
            out.append(f"no run here matches {c}")
        else:
            counts.append(f"{c}: {ev.matching}")
    if not out:
        together = "; ".join(counts)
        out.append(f"each condition alone matches runs here ({together}), but no run matches the whole filter")
    return out


def _polarities(node: Node) -> list[tuple[Comparison, bool]]:
    """Each condition once, and whether a run must meet it to match: not under a ``not`` or an ``or``."""
    found: dict[Comparison, bool] = {}

    def walk(n: Node, must: bool) -> None:
        if isinstance(n, Comparison):
            found[n] = found.get(n, False) or must
        elif isinstance(n, Not):
            walk(n.part, False)
        else:
            for p in n.parts:
                walk(p, must and (isinstance(n, And) or len(n.parts) == 1))

    walk(node, True)
    return list(found.items())


def evidence(c: Comparison, runs: Sequence[RunFacts]) -> Evidence:
    """What ``c`` finds alone among ``runs``, in Python (in SQL:
    :meth:`ember.server.services.filtering.Compiler.evidence`)."""
    matching = sum(_holds(c, r) for r in runs)
    if c.field.kind == "hp":
        found = [v for present, v in (lookup(r.hparams, c.field.key) for r in runs) if present]
        shown = sorted({json.dumps(v, sort_keys=True)[:60] for v in found})
        return Evidence(len(found), matching, values=shown[:9])
    if c.field.kind == "m":
        facts = [r.metrics[c.field.key] for r in runs if c.field.key in r.metrics]
        values = [v for v in (f.value(c.field.agg) for f in facts) if v is not None]
        return Evidence(len(facts), matching, span=(min(values), max(values)) if values else None)
    return Evidence(matching, matching)


__all__ = [
    "AGGREGATES", "FIELDS", "MAX_KEY_DOTS", "ORDERING", "STATUSES", "And", "Comparison", "Evidence", "Field",
    "FilterError", "MetricFacts", "Node", "Not", "Or", "RunFacts", "Value", "all_of", "civil_seconds", "comparisons",
    "evidence", "explain_empty", "fold", "key_paths", "kind_of", "lookup", "matches", "metric_facts",
    "metrics_named", "parse", "parse_all", "quote", "render", "select", "start_seconds", "time_parts",
]  # fmt: skip
