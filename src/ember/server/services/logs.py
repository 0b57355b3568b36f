"""A run's output (``stdout.log``): stored in pieces by line, bounded per run, read a window at a time.

The client sends the file's text from its cursor (``POST /runs/{id}/log``). The server keeps it
in :class:`~ember.server.storage.models.LogPiece` rows of at most :data:`PIECE_CHARS` characters, each
with its offset in the stored text (UTF-8 bytes), the line it starts in and its newlines; a new
request's text continues the last piece until that one is full. What a reader asks for is read
by key, a few pieces at a time, and never more than a fixed budget of bytes, whatever the log's
size: the last lines (:func:`tail`, the run page and its live refresh), a window of lines from a
line number (:func:`window`), a search backwards from the end or from a line (:func:`search`,
at most :data:`SEARCH_BYTES` per request, with where to go on), a page of the API's text
(:func:`text_from`) and the whole output as a download, streamed (:func:`stream`).

A run's stored output is at most the server's ``max_log_bytes`` (``--max-log-mb``) and counts in
its owner's ``--quota-mb`` (``runs.log_bytes``, read by :func:`ember.server.services.blobs.usage`): a
request past either is refused whole (413) and nothing of it is kept. A request locks the owner's
row, then the cursor, then writes the run's row (the order of :mod:`ember.server.services.perms`).

Example:
    >>> view = tail(session, run.pk)
    >>> view.lines[-1], view.total
    ('epoch 3 done', 4120)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from ember.server.services import blobs, ingest
from ember.server.storage.domain_errors import Conflict, TooLarge
from ember.server.storage.models import LogPiece, Run

STREAM = "stdout.log"
PIECE_CHARS = 1 << 16
"""Characters per stored piece (the last piece of a log may hold fewer)."""
TAIL_LINES = 200
"""Lines the run page shows (its tail, or a window)."""
READ_BYTES = 1 << 20
"""The most stored bytes one tail or window reads: a longer line is shown cut."""
SEARCH_BYTES = 16 << 20
"""The most stored bytes one search request reads; the answer says where to search on."""
MAX_HITS = 500
"""Matching lines one search answers (the last ones; all are counted)."""
MAX_LINE_CHARS = 4000
"""Characters of one line shown; the rest is in the download."""
TEXT_BYTES = 4 << 20
"""The most stored bytes one ``GET /runs/{id}/log`` answers (``next_offset`` continues)."""
_BATCH = 8  # pieces per query


@dataclass(frozen=True)
class LogView:
    """Lines of a run's output as a page shows them.

    Attributes:
        lines: the lines, each cut to :data:`MAX_LINE_CHARS` characters.
        first: the 0-based number of the first line in ``lines``.
        total: the lines of the whole output (a last line without its newline counts).
        cut: the first line shown began before what was read (it is shown from the middle).
    """

    lines: list[str]
    first: int
    total: int
    cut: bool = False


@dataclass(frozen=True)
class SearchView:
    """The lines of a run's output holding a text, searched backwards.

    Attributes:
        hits: ``(line number, line)`` of the last :data:`MAX_HITS` matching lines, in order.
        count: every matching line in the searched range.
        searched_from: the first line searched (0: the search reached the beginning).
        until: the line the search started before (the output's line count without ``before``).
        total: the lines of the whole output.
    """

    hits: list[tuple[int, str]] = field(default_factory=list)
    count: int = 0
    searched_from: int = 0
    until: int = 0
    total: int = 0


def pieces(run_pk: int, text: str, start: int, line: int) -> list[dict[str, Any]]:
    """The :class:`LogPiece` rows of ``text`` stored from byte ``start`` and line ``line``.

    Example:
        >>> [r["newlines"] for r in pieces(1, "a\\nb\\n", 0, 0)]
        [2]
    """
    rows = []
    for at in range(0, len(text), PIECE_CHARS):
        part = text[at : at + PIECE_CHARS]
        size, newlines = len(part.encode("utf-8")), part.count("\n")
        row = {"run_pk": run_pk, "start": start, "end": start + size, "line": line, "newlines": newlines, "text": part}
        rows.append(row)
        start, line = start + size, line + newlines
    return rows


def _last(session: Session, run_pk: int) -> Any:
    """The last piece of a run's output (None when it has none)."""
    return session.execute(
        select(LogPiece.start, LogPiece.end, LogPiece.line, LogPiece.newlines, LogPiece.text)
        .where(LogPiece.run_pk == run_pk)
        .order_by(LogPiece.start.desc())
        .limit(1)
    ).first()


def _total(last: Any) -> int:
    """The line count of an output whose last piece is ``last``."""
    if last is None:
        return 0
    return int(last.line + last.newlines + (0 if last.text.endswith("\n") else 1))


def limit_text(run: Run, size: int, limit: int) -> str:
    """Why a request taking ``run``'s output to ``size`` bytes is refused."""
    return (
        f"run {run.name!r} ({run.id}): its output would hold {size} bytes, over the server's limit of {limit} "
        "bytes per run: print less (or to a file logged as an artifact), or ask an admin to raise "
        "`ember server --max-log-mb`"
    )


def store_log(
    session: Session, run: Run, start: int, end: int, text: str, max_bytes: int | None, quota: int | None
) -> int:
    """Store the text of bytes ``start``..``end`` of the run's stdout.log; return the new cursor.

    Args:
        session: the request's session, inside its transaction.
        run: the run (the caller has edit on it).
        start, end: the file's byte range the text came from (the cursor's units).
        text: that range decoded.
        max_bytes: the most bytes the run's stored output may hold; ``quota``: the most bytes
            its owner may hold (:func:`ember.server.services.blobs.usage`). None: no limit (``ember ui``).

    Raises:
        Conflict: 409 when ``start`` is past the cursor, or before it with new text.
        TooLarge: 413 when the text takes the run past ``max_bytes`` or its owner past
            ``quota``; the caller's transaction is rolled back, so nothing of it is kept.
    """
    blobs.hold(session, run.owner_id, quota)
    ingest.lock_cursor(session, "run", run.id, STREAM)
    current = ingest.check_start(session, "run", run.id, STREAM, start, end)
    if end <= current or not text:
        return current
    if start < current:
        raise Conflict(
            f"{STREAM}: the server has bytes up to {current}; send the text from byte {current}, not {start}"
        )
    last = _last(session, run.pk)
    added = len(text.encode("utf-8"))
    size = (last.end if last is not None else 0) + added
    if max_bytes is not None and size > max_bytes:
        raise TooLarge(limit_text(run, size, max_bytes))
    at, line = (last.end, last.line + last.newlines) if last is not None else (0, 0)
    if last is not None and len(last.text) < PIECE_CHARS:  # the last piece is continued
        session.execute(delete(LogPiece).where(LogPiece.run_pk == run.pk, LogPiece.start == last.start))
        at, line, text = last.start, last.line, last.text + text
    session.execute(insert(LogPiece), pieces(run.pk, text, at, line))
    run.log_bytes = size
    blobs.charge(session, run.owner_id, added, quota)
    return ingest.advance(session, "run", run.id, STREAM, end)


def _backwards(session: Session, run_pk: int, before: int | None) -> Iterator[Any]:
    """The pieces of a run's output from the end (or from byte ``before``) towards its start."""
    while True:
        query = select(LogPiece.start, LogPiece.end, LogPiece.line, LogPiece.newlines, LogPiece.text).where(
            LogPiece.run_pk == run_pk
        )
        if before is not None:
            query = query.where(LogPiece.start < before)
        rows = session.execute(query.order_by(LogPiece.start.desc()).limit(_BATCH)).all()
        yield from rows
        if len(rows) < _BATCH:
            return
        before = rows[-1].start


def _forwards(session: Session, run_pk: int, start: int) -> Iterator[Any]:
    """The pieces of a run's output from the one at byte ``start`` towards its end."""
    while True:
        rows = session.execute(
            select(LogPiece.start, LogPiece.end, LogPiece.line, LogPiece.newlines, LogPiece.text)
            .where(LogPiece.run_pk == run_pk, LogPiece.start >= start)
            .order_by(LogPiece.start)
            .limit(_BATCH)
        ).all()
        yield from rows
        if len(rows) < _BATCH:
            return
        start = rows[-1].end


def _shown(line: str, from_end: bool = False) -> str:
    """A line cut to :data:`MAX_LINE_CHARS` (its end when ``from_end``: the newest part of a progress bar)."""
    if len(line) <= MAX_LINE_CHARS:
        return line
    more = len(line) - MAX_LINE_CHARS
    if from_end:
        return f"[... {more} characters] " + line[-MAX_LINE_CHARS:]
    return line[:MAX_LINE_CHARS] + f" [... {more} more characters]"


def _lines_of(text: str) -> list[str]:
    """``text`` split at newlines; a final newline ends the last line (it starts no empty one)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def tail(session: Session, run_pk: int, count: int = TAIL_LINES) -> LogView:
    """The last ``count`` lines of a run's output, reading at most about :data:`READ_BYTES` of it."""
    texts: list[str] = []
    total, read, newlines, at_start = None, 0, 0, False
    for piece in _backwards(session, run_pk, None):
        if total is None:
            total = _total(piece)
        texts.append(piece.text)
        read += piece.end - piece.start
        newlines += piece.newlines
        at_start = piece.start == 0
        if newlines > count or read >= READ_BYTES:
            break
    if total is None:
        return LogView([], 0, 0)
    text = "".join(reversed(texts))
    parts = text.rsplit("\n", count + 1)
    if parts[-1] == "":  # the output ends with a newline
        parts.pop()
    cut = False
    if len(parts) > count:
        parts = parts[-count:]
    elif not at_start:  # the read began inside a line longer than the budget
        cut = True
    lines = [_shown(p, from_end=cut and i == 0) for i, p in enumerate(parts)]
    return LogView(lines, total - len(lines), total, cut)


def _piece_holding_line(session: Session, run_pk: int, line: int) -> int:
    """The start of the piece in which line ``line`` (0-based) begins: the one holding the newline before it."""
    if line <= 0:
        return 0
    found = session.scalar(
        select(LogPiece.start)
        .where(LogPiece.run_pk == run_pk, LogPiece.line <= line - 1, LogPiece.newlines > 0)
        .order_by(LogPiece.line.desc(), LogPiece.start.desc())
        .limit(1)
    )
    return int(found or 0)


def _skip_lines(text: str, count: int) -> int:
    """The index in ``text`` just after its ``count``-th newline (0 for none)."""
    at = 0
    for _ in range(count):
        at = text.index("\n", at) + 1
    return at


def window(session: Session, run_pk: int, first: int, count: int = TAIL_LINES) -> LogView:
    """Lines ``first``.. (0-based) of a run's output, ``count`` of them, reading at most about :data:`READ_BYTES`.

    A ``first`` past the end gives the tail.
    """
    last = _last(session, run_pk)
    total = _total(last)
    if first + count >= total:
        return tail(session, run_pk, count)
    begin = _piece_holding_line(session, run_pk, first)
    texts: list[str] = []
    read, newlines, skip = 0, 0, None
    for piece in _forwards(session, run_pk, begin):
        if skip is None:
            skip = max(0, first - piece.line)
        texts.append(piece.text)
        read += piece.end - piece.start
        newlines += piece.newlines
        if newlines >= skip + count or read >= READ_BYTES:
            break
    text = "".join(texts)
    body = text[_skip_lines(text, skip or 0) :]
    parts = body.split("\n", count)[:count]
    return LogView([_shown(p) for p in parts], first, total)


def search(session: Session, run_pk: int, needle: str, before: int | None = None) -> SearchView:
    """The lines holding ``needle`` (ignoring case), searched backwards from the end or from line ``before``.

    Reads at most about :data:`SEARCH_BYTES` of stored text, a piece at a time; ``searched_from``
    says where it stopped (search again with ``before=searched_from`` to go on). A term is found
    within a line, whichever pieces the line spans.
    """
    wanted = needle.casefold()
    total = _total(_last(session, run_pk))
    until = total if before is None else min(max(0, before), total)
    if until == 0 or not wanted:
        return SearchView([], 0, 0, until, total)
    begin = None if until == total else _piece_holding_line(session, run_pk, until)
    hits: list[tuple[int, str]] = []
    count, read, carry, searched_from = 0, 0, "", until
    for i, piece in enumerate(_backwards(session, run_pk, None if begin is None else begin + 1)):
        text = piece.text
        if i == 0:  # up to the end of line ``until - 1``, without the newline that ends it
            text = text[: _skip_lines(text, until - piece.line)] if begin is not None else text
            text = text.removesuffix("\n")
        # ``carry``: the start of the line the later pieces began in; joined, it is a whole line here
        # unless this piece holds no newline (the line began earlier still).
        combined = text + carry
        cut = -1 if piece.start == 0 else combined.find("\n")
        if piece.start == 0:
            number, block, carry = 0, combined, ""
        elif cut >= 0:
            number, block, carry = piece.line + 1, combined[cut + 1 :], combined[:cut]
        else:
            number, block, carry = piece.line + 1, "", combined
        if wanted in block.casefold():
            found = [(number + k, line) for k, line in enumerate(block.split("\n")) if wanted in line.casefold()]
            count += len(found)
            if len(hits) < MAX_HITS:
                hits = (found + hits)[-MAX_HITS:]
        read += piece.end - piece.start
        searched_from = number
        if read >= SEARCH_BYTES:
            break
    return SearchView([(n, _shown(line)) for n, line in hits], count, searched_from, until, total)


def text_from(session: Session, run_pk: int, offset: int) -> dict[str, Any]:
    """The stored text from the piece holding byte ``offset``, at most about :data:`TEXT_BYTES` of it.

    Returns:
        ``{"text", "offset": where the text starts, "next_offset": where the next request
        starts, None at the end}``.
    """
    begin = session.scalar(
        select(LogPiece.start)
        .where(LogPiece.run_pk == run_pk, LogPiece.start <= offset)
        .order_by(LogPiece.start.desc())
        .limit(1)
    )
    texts: list[str] = []
    read, end, more = 0, int(begin or 0), False
    for piece in _forwards(session, run_pk, int(begin or 0)):
        if read >= TEXT_BYTES:
            more = True
            break
        texts.append(piece.text)
        read += piece.end - piece.start
        end = piece.end
    return {"text": "".join(texts), "offset": int(begin or 0), "next_offset": end if more else None}


def stream(sessions: Callable[[], Session], run_pk: int) -> Iterator[str]:
    """The whole stored output, a few pieces per read, each read in a short transaction of its own."""
    start = 0
    while True:
        with sessions() as session, session.begin():
            rows = session.execute(
                select(LogPiece.end, LogPiece.text)
                .where(LogPiece.run_pk == run_pk, LogPiece.start >= start)
                .order_by(LogPiece.start)
                .limit(_BATCH * 8)
            ).all()
        if rows:
            yield "".join(text for _, text in rows)
            start = rows[-1][0]
        if len(rows) < _BATCH * 8:
            return
