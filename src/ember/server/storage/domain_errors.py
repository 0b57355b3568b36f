"""What the server's services refuse with: ember's own errors, free of HTTP.

The service and query modules (``lookup``, ``runs``, ``listing``, ``folder_paging``, ``ingest``,
``images``, ``blobs``, ``perms``, ``naming``, ``codec``...) raise these; the routes let them
pass, and one exception handler (:mod:`ember.server.api.errors`) answers each with its ``status``
and ``{"detail": message}`` (``errors`` too when the refusal names fields). The console's pages,
and the in-process uploads (:mod:`ember.server.services.upload`), read the same errors.

Example:
    >>> raise NotFound("run 0123... does not exist or is not shared with you")
"""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    """A request the server refuses on purpose; ``detail`` says why, ``errors`` names fields (or is empty).

    ``status`` is the HTTP status code that answers it (each kind below has its own).
    """

    status = 400

    def __init__(self, detail: str, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = errors or []


class NotFound(DomainError):
    """Nothing there, or nothing the caller may view (the two are one answer: 404)."""

    status = 404


class Forbidden(DomainError):
    """The caller may view it but not do this (403)."""

    status = 403


class Invalid(DomainError):
    """A value the server does not accept (422)."""

    status = 422

    @classmethod
    def field(cls, field: str, message: str, detail: str | None = None) -> Invalid:
        """A refusal naming one field: ``detail`` defaults to ``"<field>: <message>"``.

        Example:
            >>> Invalid.field("run.name", "holds a lone surrogate (\\\\ud800)").errors
            [{'field': 'run.name', 'message': 'holds a lone surrogate (\\\\ud800)'}]
        """
        return cls(detail if detail is not None else f"{field}: {message}", [{"field": field, "message": message}])


class TooLarge(DomainError):
    """More than the server takes at once, or past a quota (413)."""

    status = 413


class Conflict(DomainError):
    """The request clashes with what is stored: a cursor passed, a name taken, a blob not uploaded (409)."""

    status = 409


class Gone(DomainError):
    """The record is there but its stored bytes are not (410)."""

    status = 410
