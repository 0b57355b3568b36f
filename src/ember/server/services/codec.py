"""JSON in and out: bodies checked as they are decoded, answers that always encode; no HTTP.

What the server accepts it must be able to give back. Python's JSON decoder accepts ``NaN``,
``Infinity`` and ``1e999`` (an infinite float), ``"\\ud800"`` (a lone surrogate, which no UTF-8
encoder can write) and ``"\\u0000"`` (NUL, which PostgreSQL text cannot hold). Such values used
to be stored and then made every answer that included them fail. :func:`loads` refuses them
with :class:`~ember.server.storage.domain_errors.Invalid` naming the field (``run.hparams.lr``); an
infinite number from ``1e999`` is refused by the typed fields (``schemas.Number``) and, in
free-form JSON, by :func:`check`. :func:`encode` writes rows stored before these checks too: a
non-finite number as the strings ``"NaN"``/``"Infinity"``/``"-Infinity"`` (the API's spelling of
them), a lone surrogate as U+FFFD. The HTTP side (the route class that decodes with
:func:`loads`, the JSON response that encodes with :func:`encode`) is :mod:`ember.server.api.wire`.

Example:
    >>> loads(b'{"run": {"hparams": {"lr": NaN}}}')
    Traceback (most recent call last):
    ember.server.storage.domain_errors.Invalid: run.hparams.lr: NaN is not a JSON number; ...
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ember.server.storage.domain_errors import Invalid, TooLarge

MAX_BACKSLASHES = 1 << 20
"""The most backslashes one body may hold, that is escapes (``\\n``, ``\\uXXXX``; ``\\\\`` counts two):
decoding costs about 25 ns an escape, in one call that no other request of the process can
interrupt (a log request of 4 Mi newlines held every other request for 0.1-0.3 s). ember's client
sends a run's output in requests of at most 512 KiB, which stay under it whatever the text."""
_SUSPECT = re.compile(r"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")
_SURROGATE = re.compile("[\ud800-\udfff]")
_NON_FINITE = {"NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity"}


class _NonFinite:
    """What the decoder makes of ``NaN``/``Infinity``/``-Infinity`` literals: a marker to report."""

    __slots__ = ("token",)

    def __init__(self, token: str) -> None:
        self.token = token


def _path(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    shown = key if key.isidentifier() else json.dumps(key)
    return f"{parent}.{shown}" if parent else shown


def _walk(value: Any, where: str) -> None:
    """Raise :class:`~ember.server.storage.domain_errors.Invalid` at the first value the server could not
    store or return."""
    if isinstance(value, str):
        _check_text(value, where or "body")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, f"{_path(where, key)} (the key)")
            _walk(item, _path(where, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _walk(item, _path(where, i))
    elif isinstance(value, _NonFinite) or (isinstance(value, float) and not math.isfinite(value)):
        token = value.token if isinstance(value, _NonFinite) else repr(value)
        raise Invalid.field(
            where or "body",
            f"{token} is not a JSON number; a metric value sends NaN and infinities as the strings "
            '"NaN", "Infinity" and "-Infinity", and nothing else may be non-finite',
        )


def _check_text(text: str, where: str) -> None:
    if "\x00" in text:
        raise Invalid.field(where, "holds a NUL character (\\u0000), which the server cannot store")
    if _SURROGATE.search(text):
        raise Invalid.field(
            where, "holds a lone surrogate (\\ud800-\\udfff), which is not text: send valid UTF-16 pairs"
        )


def loads(body: bytes) -> Any:
    """Decode a request body, refusing what could not be stored or read back (see the module).

    Raises:
        Invalid: 422 naming the field of a NaN/Infinity literal, an infinite number, a NUL or
            a lone surrogate, or the body itself when it is not UTF-8.
        TooLarge: 413 when the body holds more than :data:`MAX_BACKSLASHES` backslashes.
        json.JSONDecodeError: the body is not JSON (FastAPI answers 422).
    """
    escapes = body.count(b"\\")
    if escapes > MAX_BACKSLASHES:
        raise TooLarge(
            f"the request body holds {escapes} backslashes (escapes such as \\n or \\uXXXX), over the "
            f"{MAX_BACKSLASHES} one request may hold: send the text in smaller requests"
        )
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Invalid.field("body", f"is not UTF-8 (byte {e.start})") from None
    flagged = False

    def constant(token: str) -> _NonFinite:
        nonlocal flagged
        flagged = True
        return _NonFinite(token)

    value = json.loads(text, parse_constant=constant)
    if flagged or ("\\u" in text and _SUSPECT.search(text)):
        _walk(value, "")
    return value


def check(value: Any, field: str) -> None:
    """Walk a free-form JSON value (a run's ``run.json``) for what :func:`loads` lets through cheaply.

    ``1e999`` decodes to an infinite float: typed fields refuse it (``schemas.Number``); free-form
    ones are walked here, which costs little for a run's metadata.

    The value is first written as escaped JSON in C (a few µs for a run.json): only when that fails
    (a non-finite number) or shows an escape that may be a NUL or a surrogate is it walked in
    Python to name the field; a value that is fine is never walked (``ember ui`` checks thousands).

    Raises:
        Invalid: 422 naming the field of the first non-finite number, NUL or lone surrogate.
    """
    try:
        text = json.dumps(value, allow_nan=False)  # ASCII: every NUL and surrogate written as \uXXXX
    except (ValueError, TypeError, RecursionError):
        text = None
    if text is None or _SUSPECT.search(text):
        _walk(value, field)


def safe(value: Any) -> Any:
    """``value`` with every non-finite float spelt as a string and lone surrogates as U+FFFD."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {safe(k) if isinstance(k, str) else k: safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [safe(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """JSON text of ``value``; values stored before the checks are encoded by :func:`safe`."""
    return encode(value).decode("utf-8")


def encode(value: Any) -> bytes:
    """UTF-8 JSON of ``value``; values stored before the checks are encoded by :func:`safe`."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except (ValueError, UnicodeEncodeError):
        return json.dumps(safe(value), ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
