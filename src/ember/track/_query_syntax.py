"""Reading ember's filter language (:mod:`ember.track.query`): tokens and a recursive-descent parser."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ember.errors import TrackingError, short_repr
from ember.track._query_tree import (
    AGGREGATES,
    AGO,
    FIELDS,
    MAX_CHARS,
    MAX_CONDITIONS,
    MAX_DEPTH,
    NUMBER,
    OPS_OF,
    STATUSES,
    UNIT_S,
    WORD_END,
    And,
    Comparison,
    Field,
    FilterError,
    Node,
    Not,
    Or,
    Value,
    joined,
    start_seconds,
)
from ember.track.best import metric_key

# -- reading a filter -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Token:
    kind: str  # "(" ")" "," ";" "op" "str" "word" "end"
    text: str
    start: int  # 0-based
    end: int


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c in "(),;":
            out.append(_Token(c, c, i, i + 1))
            i += 1
        elif c in "<>=!~":
            two = text[i : i + 2]
            if two in ("<=", ">=", "!=", "=="):
                out.append(_Token("op", "=" if two == "==" else two, i, i + 2))
                i += 2
            elif c == "!":
                raise FilterError(text, i + 1, "'!' must be followed by '=' (write != for 'not equal')")
            else:
                out.append(_Token("op", c, i, i + 1))
                i += 1
        elif c in "\"'":
            j, chars = i + 1, []
            while j < n and text[j] != c:
                if text[j] == "\\" and j + 1 < n:
                    j += 1
                chars.append(text[j])
                j += 1
            if j >= n:
                raise FilterError(text, i + 1, f"this {c} opens a string that is never closed")
            out.append(_Token("str", "".join(chars), i, j + 1))
            i = j + 1
        else:
            j = i
            while j < n and text[j] not in WORD_END and not text[j].isspace():
                j += 1
            out.append(_Token("word", text[i:j], i, j))
            i = j
    out.append(_Token("end", "", n, n))
    return out


class _Parser:
    def __init__(self, text: str, now: float) -> None:
        self.text, self.now = text, now
        if len(text) > MAX_CHARS:
            raise FilterError(text[:80], 1, f"a filter is at most {MAX_CHARS:,} characters, this one {len(text):,}")
        self.tokens = _tokens(text)
        self.i = 0
        self.depth = 0  # parentheses and nots open: bounded, so a hostile filter cannot exhaust the stack
        self.count = 0

    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def _next(self) -> _Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def _fail(self, tok: _Token, reason: str) -> FilterError:
        return FilterError(self.text, tok.start + 1, reason)

    def _is(self, tok: _Token, word: str) -> bool:
        return tok.kind == "word" and tok.text.lower() == word

    def filter(self) -> Node | None:
        found = self.clauses(top=True)
        if self.tok.kind != "end":
            raise self._fail(self.tok, _unexpected(self.tok))
        return found

    def clauses(self, top: bool) -> Node | None:
        parts: list[Node] = []
        while True:
            if self.tok.kind in (";", ","):  # empty clauses (a trailing ';') are skipped
                self._next()
                continue
            if self.tok.kind == "end" or (self.tok.kind == ")" and not top):
                break
            parts.append(self.disjunction())
            if self.tok.kind not in (";", ","):
                break
        return joined(And, parts)

    def disjunction(self) -> Node:
        return self._chain("or", Or, self.conjunction)

    def conjunction(self) -> Node:
        return self._chain("and", And, self.negation)

    def _chain(self, word: str, kind: type[And] | type[Or], part: Callable[[], Node]) -> Node:
        """``part (word part)*`` as one ``kind`` (a single part: itself)."""
        parts = [part()]
        while self._is(self.tok, word):
            self._next()
            parts.append(part())
        return joined(kind, parts) or parts[0]

    def negation(self) -> Node:
        if self._is(self.tok, "not"):
            self._deeper(self._next())
            found = Not(self.negation())
            self.depth -= 1
            return found
        return self.primary()

    def _deeper(self, tok: _Token) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self._fail(tok, f"more than {MAX_DEPTH} parentheses or nots inside each other")

    def primary(self) -> Node:
        tok = self.tok
        if tok.kind == "(":
            self._deeper(self._next())
            inner = self.clauses(top=False)
            self.depth -= 1
            if self.tok.kind != ")":
                if self.tok.kind == "end":
                    raise self._fail(tok, "this '(' is never closed")
                raise self._fail(self.tok, _unexpected(self.tok))
            if inner is None:
                raise self._fail(tok, "nothing between these parentheses: put a condition in them")
            self._next()
            return inner
        if tok.kind == "end":
            raise self._fail(tok, "a condition is missing, e.g. hp:lr < 0.01")
        if tok.kind != "word" or self._is(tok, "and") or self._is(tok, "or"):
            raise self._fail(tok, f"expected a condition (e.g. hp:lr < 0.01), got {_shown(tok)}")
        return self.comparison()

    def comparison(self) -> Comparison:
        start = self.tok
        self.count += 1
        if self.count > MAX_CONDITIONS:
            raise self._fail(start, f"more than {MAX_CONDITIONS} conditions in one filter")
        fld = self.field()
        op_tok = self.tok
        if op_tok.kind == "op":
            op = self._next().text
        elif self._is(op_tok, "in"):
            self._next()
            op = "in"
        elif self._is(op_tok, "not") and self._is(self.tokens[self.i + 1], "in"):
            self.i += 2
            op = "not in"
        else:
            raise self._fail(op_tok, f"expected an operator (= != < <= > >= ~ in) after {fld}, got {_shown(op_tok)}")
        if op not in OPS_OF[fld.kind]:
            raise self._fail(op_tok, _op_refused(fld, op))
        values = self.value_list(fld, op) if op in ("in", "not in") else (self.value(fld, op),)
        return Comparison(fld, op, values, start.start + 1)

    def field(self) -> Field:
        tok = self._next()
        lowered = tok.text.lower()
        if lowered.startswith(("hp:", "m:")):
            kind = "hp" if lowered.startswith("hp:") else "m"
            raw, quoted = tok.text[len(kind) + 1 :], False
            nxt = self.tok
            if not raw and nxt.kind == "str" and nxt.start == tok.end:
                raw, quoted = self._next().text, True
            if not raw:
                example = "hp:lr" if kind == "hp" else "m:val/acc"
                raise self._fail(tok, f"{tok.text} needs a name after the colon, e.g. {example}")
            return self._hparam(tok, raw) if kind == "hp" else self._metric(tok, raw, quoted)
        if lowered in FIELDS or lowered == "labels":
            return Field("label" if lowered == "labels" else lowered)  # type: ignore[arg-type]
        if ":" not in tok.text:
            hint = f"write hp:{tok.text} for a hyper-parameter, m:TYPE/NAME for a metric (e.g. m:val/acc), or"
            raise self._fail(tok, f"{tok.text!r} is not something a run has: {hint} one of {', '.join(FIELDS)}")
        raise self._fail(tok, f"{tok.text!r}: a key starts with hp: (hyper-parameter) or m: (metric, TYPE/NAME)")

    def _hparam(self, tok: _Token, key: str) -> Field:
        if any(not p or '"' in p or any(ord(c) < 32 for c in p) for p in key.split(".")):
            why = 'a part between dots is empty or holds a " or a control character'
            raise self._fail(tok, f"the hyper-parameter {short_repr(key)} cannot be looked up: {why}")
        return Field("hp", key)

    def _metric(self, tok: _Token, raw: str, quoted: bool) -> Field:
        agg = "last"
        if quoted:
            nxt = self.tok
            if nxt.kind == "word" and nxt.start == self.tokens[self.i - 1].end and nxt.text.startswith("."):
                agg = self._next().text[1:].lower()
                if agg not in AGGREGATES:
                    raise self._fail(nxt, f"{nxt.text!r}: a metric is read as .last, .best, .min or .max")
        else:
            head, dot, tail = raw.rpartition(".")
            if dot and tail.lower() in AGGREGATES:
                raw, agg = head, tail.lower()
        try:
            key = metric_key(raw)
        except TrackingError as e:
            raise self._fail(tok, str(e)) from None
        return Field("m", key, agg)

    def value_list(self, fld: Field, op: str) -> tuple[Value, ...]:
        if self.tok.kind != "(":
            raise self._fail(self.tok, f"{op} takes a list in parentheses, e.g. {fld} {op} (a, b)")
        opened = self._next()
        values = []
        while True:
            values.append(self.value(fld, op))
            if self.tok.kind == ",":
                self._next()
                continue
            if self.tok.kind == ")":
                self._next()
                return tuple(values)
            if self.tok.kind == "end":
                raise self._fail(opened, "this '(' is never closed")
            raise self._fail(self.tok, f"expected ',' or ')' in the list, got {_shown(self.tok)}")

    def value(self, fld: Field, op: str) -> Value:
        tok = self.tok
        if tok.kind not in ("word", "str"):
            raise self._fail(tok, f"expected a value after {fld} {op}, got {_shown(tok)}")
        self._next()
        quoted = tok.kind == "str"
        text = tok.text
        if fld.kind == "start":
            return self._time(tok)
        if fld.kind == "m":
            if quoted or not NUMBER.fullmatch(text):
                raise self._fail(tok, f"{fld} is a number, and {short_repr(text)} is not one: write e.g. {fld} > 0.9")
            return Value(float(text), text)
        if fld.kind == "status":
            found = {s.lower(): s for s in STATUSES}.get(text.lower())
            if found is None:
                raise self._fail(tok, f"status {short_repr(text)} is not one of {', '.join(STATUSES)}")
            return Value(found, found)
        if fld.kind in ("label", "name") or quoted or op == "~":
            return Value(text, text, quoted)
        return Value(_typed(text), text)

    def _time(self, tok: _Token) -> Value:
        text = tok.text
        ago = AGO.fullmatch(text)
        if ago and tok.kind == "word" and self._is(self.tok, "ago"):
            self._next()
            return Value(math.floor(self.now - float(ago[1]) * UNIT_S[ago[2]]), f"{text} ago")
        seconds = start_seconds(text)
        if seconds is None:
            forms = "2026-11-01, 2026-11-01T10:00, 2026-11-01T10:00:00+02:00"
            raise self._fail(
                tok, f"{short_repr(text)} is not a time: write ISO 8601 ({forms}) or e.g. 7d ago (s m h d w)"
            )
        return Value(seconds, text, tok.kind == "str")


def _shown(tok: _Token) -> str:
    return "the end" if tok.kind == "end" else short_repr(tok.text)


def _unexpected(tok: _Token) -> str:
    if tok.kind == ")":
        return "this ')' closes nothing"
    return f"expected and, or, ';' or the end, got {_shown(tok)} (two conditions need 'and' or 'or' between them)"


def _op_refused(fld: Field, op: str) -> str:
    ops = OPS_OF[fld.kind]
    allowed = ", ".join(ops[:-1]) + " or " + ops[-1]
    if fld.kind == "start" and op in ("=", "!="):
        return "start takes < <= > >=: for one day write start >= 2026-11-01 and start < 2026-11-02"
    if fld.kind == "m" and op == "~":
        return f"{fld} is a number: '~' (contains) is for text"
    return f"{fld} takes {allowed}, not {op!r}"


def _typed(text: str) -> Any:
    """An unquoted hparam value: a number, true/false, null, else the word itself."""
    if NUMBER.fullmatch(text):
        return float(text)
    return {"true": True, "false": False, "null": None}.get(text.lower(), text)


def read(text: str, now: float) -> Node | None:
    """The tree of ``text`` (None when it holds no condition); ``now``: what ``7d ago`` counts back from."""
    return _Parser(text, now).filter()


def read_field(text: str) -> Field:
    """The one field ``text`` names (``m:val/acc.best``, ``hp:opt.lr``, ``name``), nothing after it."""
    parser = _Parser(text, 0.0)
    if parser.tok.kind == "end":
        raise FilterError(text, 1, "expected a field, e.g. m:val/acc.best or hp:lr")
    found = parser.field()
    if parser.tok.kind != "end":
        raise parser._fail(parser.tok, f"{found} is one field: nothing may follow it")
    return found
