"""Checks for every path-like value a client sends: folder paths, file paths, ids, hashes, names.

Nothing a client sends is ever joined to a path on disk: blobs live under their sha256 (checked
here to be 64 hex digits) and everything else is a database value. These checks still refuse
the path tricks of MLflow's CVE history (``../``, ``..\\``, encoded dots and slashes, absolute
paths, drive letters, ``#``/``?``, NUL, over-long names) so a bad value is a clear 422
(:class:`~ember.server.storage.domain_errors.Invalid`), not a surprise later.
"""

from __future__ import annotations

import re

from ember.server.storage.domain_errors import Invalid

MAX_NAME = 100
MAX_PATH = 1024
_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\- ]{0,99}$")
_USER = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_DRIVE = re.compile(r"^[A-Za-z]:")
_FORBIDDEN_IN_PATHS = set("\\#?%\0") | {chr(c) for c in range(32)} | {"\x7f"}


def bad(what: str, value: object, rule: str) -> Invalid:
    """A 422 naming the field, its (shortened) value and what is allowed."""
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return Invalid.field(what, f"{shown} is not allowed: {rule}", detail=f"{what} {shown} is not allowed: {rule}")


def user_name(name: str) -> str:
    """A user name: 1-32 of a-z, 0-9, '_', '-', starting with a letter."""
    if not isinstance(name, str) or not _USER.fullmatch(name):
        raise bad("user name", name, "use 1-32 characters a-z, 0-9, '_' or '-', starting with a letter")
    return name


def node_id(value: str, what: str = "id") -> str:
    """A run or artifact id: 32 lowercase hex digits (a uuid4 as the local store writes it)."""
    if not isinstance(value, str) or not _HEX32.fullmatch(value):
        raise bad(what, value, "use the 32 lowercase hex digits of the local run.json/artifact.json id")
    return value


def sha256(value: str) -> str:
    """A sha256 digest: 64 lowercase hex digits."""
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise bad("sha256", value, "use 64 lowercase hex digits")
    return value


def display_name(value: str, what: str = "name") -> str:
    """A run or artifact name, with the local store's rules (it names a local folder)."""
    ok = (
        isinstance(value, str)
        and 0 < len(value) <= MAX_NAME
        and value != "."
        and ".." not in value
        and not any(c in _FORBIDDEN_IN_PATHS or c == "/" for c in value)
    )
    if not ok:
        raise bad(what, value, f"use 1-{MAX_NAME} characters without '/', '\\', '..', '#', '?', '%' or NUL")
    return value


def rel_path(value: str, what: str = "path") -> str:
    """A file path inside an artifact: '/'-separated names, no '..', '.', empty parts or tricks."""
    if not isinstance(value, str):
        raise bad(what, value, "use a str")
    parts = value.split("/")
    ok = (
        0 < len(value) <= MAX_PATH
        and not _DRIVE.match(value)
        and not any(c in _FORBIDDEN_IN_PATHS for c in value)
        and all(p not in ("", ".", "..") and len(p) <= 255 for p in parts)
    )
    if not ok:
        raise bad(
            what,
            value,
            "use a relative path of '/'-separated names without '..', '.', empty parts, a leading '/', "
            "a drive letter, '\\', '#', '?', '%' or control characters, e.g. 'weights/model.pt'",
        )
    return value


def folder_segment(value: str) -> str:
    """One folder name: letters, digits, '_', '.', '-', spaces; not starting with '.' or '-'."""
    if not isinstance(value, str) or not _SEGMENT.fullmatch(value) or ".." in value:
        raise bad("folder name", value, "use 1-100 letters, digits, '_', '.', '-' or spaces, starting with a letter")
    return value


def folder_path(value: str, home: str | None = None) -> str:
    """An absolute folder path '/user/a/b'; a relative one is taken under ``home`` ('/user').

    Example:
        >>> folder_path("examples", home="/alice")
        '/alice/examples'
    """
    if not isinstance(value, str) or not value or len(value) > MAX_PATH:
        raise bad("folder", value, f"use an absolute '/user/a/b' or relative 'a/b' path of at most {MAX_PATH}")
    relative = not value.startswith("/")
    body = value.rstrip("/") if len(value) > 1 else value
    parts = body.strip("/").split("/") if body.strip("/") else []
    for part in parts:
        folder_segment(part)
    if relative:
        if home is None:
            raise bad("folder", value, "use an absolute path such as '/alice/examples'")
        return home + ("/" + "/".join(parts) if parts else "")
    if not parts:
        raise bad("folder", value, "'/' holds only the users' homes; use '/<user>/...'")
    user_name(parts[0])
    return "/" + "/".join(parts)
