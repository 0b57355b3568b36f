"""JSON errors for every failure, and the request size limit (a clear 413).

The services raise ember's own errors (:mod:`ember.server.storage.domain_errors`); :func:`status_of` is
the one map from them to status codes, used by the API's handler here and by the console. Every
error response is ``{"detail": "<message>"}`` (validation errors add ``errors``, the
list of offending fields). An unexpected exception is logged on the server with its traceback
and answered with a 500 that carries no trace (by :class:`ember.server.api.guard.Hardened`, which
keeps the connection open); the tests treat any 500 as a bug.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import IntegrityError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ember.server.api.wire import FieldError, SafeJSONResponse
from ember.server.storage.domain_errors import DomainError

log = logging.getLogger("ember.server")


def _field(error: dict[str, Any]) -> str:
    """``("body", "points", 0, "time")`` -> ``points[0].time``, as the server's own checks name fields."""
    out = ""
    for part in error.get("loc", ()):
        if part == "body" and not out:
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


async def _validation(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [{"field": _field(e), "message": str(e.get("msg", ""))} for e in exc.errors()]
    first = errors[0] if errors else {"field": "body", "message": "invalid"}
    if any(e["message"].startswith("JSON decode error") for e in errors):
        message = "the request body is not valid JSON"
    else:
        message = f"{first['field']}: {first['message']}" + (
            f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        )
    return SafeJSONResponse({"detail": message, "errors": errors}, status_code=422)


async def _http(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    body: dict[str, Any] = {"detail": str(exc.detail)}
    if isinstance(exc, FieldError):
        body["errors"] = exc.errors
    return SafeJSONResponse(body, status_code=exc.status_code, headers=exc.headers)


def status_of(error: DomainError) -> int:
    """The HTTP status code that answers a domain error (its ``status``: 400 for one of no known kind)."""
    return error.status


async def _refused(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DomainError)
    body: dict[str, Any] = {"detail": exc.detail}
    if exc.errors:
        body["errors"] = exc.errors
    return SafeJSONResponse(body, status_code=status_of(exc))


async def _conflict(_request: Request, exc: Exception) -> JSONResponse:
    log.warning("integrity error: %s", exc.__class__.__name__)
    # Retry-After marks this 409 as one to send again (the upload client does; see ember.track.retry),
    # unlike a 409 that says what to change (a cursor, a name taken).
    return JSONResponse(
        {"detail": "a concurrent request changed the same data; retry the request"},
        status_code=409,
        headers={"Retry-After": "1"},
    )


def install(app: FastAPI) -> None:
    """Register the JSON error handlers on ``app``."""
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(DomainError, _refused)
    app.add_exception_handler(IntegrityError, _conflict)


class BodyLimit:
    """ASGI middleware: refuse a body over the limit with 413, by Content-Length or as it streams.

    ``limits`` maps path prefixes to their limit (the longest matching prefix wins).
    """

    def __init__(self, app: ASGIApp, default: int, limits: dict[str, int]) -> None:
        self.app = app
        self.default = default
        self.limits = sorted(limits.items(), key=lambda kv: -len(kv[0]))

    def _limit(self, path: str) -> int:
        return next((limit for prefix, limit in self.limits if path.startswith(prefix)), self.default)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self._limit(scope.get("path", ""))
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await _too_large(limit, send)
            return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    # An HTTPException, so that FastAPI's body parsing passes it on as it is.
                    raise StarletteHTTPException(413, _message(limit))
            return message

        await self.app(scope, counting_receive, send)


def _message(limit: int) -> str:
    return f"the request body passes the server's limit of {limit} bytes"


async def _too_large(limit: int, send: Send) -> None:
    body = json.dumps({"detail": _message(limit)}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
