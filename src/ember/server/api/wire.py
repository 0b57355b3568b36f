"""The HTTP side of what crosses the wire: the API's route class and JSON answers that always encode.

:class:`CheckedRoute` decodes request bodies with :func:`ember.server.services.codec.loads`, which
refuses what the server could not store or give back (NaN, infinities, NUL, lone surrogates)
with a 422 naming the field (``run.hparams.lr``). Answers go through :class:`SafeJSONResponse`,
which encodes with :func:`ember.server.services.codec.encode`: rows stored before these checks come back
too. :func:`content_disposition` names a downloaded file.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from ember.server.services.codec import encode, loads, safe
from ember.server.storage.domain_errors import Invalid, TooLarge

LineageDepth = Annotated[
    str, Query(max_length=20, description="levels of lineage each way: 1 (the neighbours), 2, ... or all")
]
"""A run's or artifact's ``?depth=``, read by :func:`ember.server.services.edges.parse_depth`."""


class FieldError(HTTPException):
    """A body :func:`~ember.server.services.codec.loads` refused, as FastAPI's body parsing lets it pass: a 422
    whose JSON lists the offending field under ``errors``."""

    def __init__(self, refused: Invalid) -> None:
        super().__init__(422, refused.detail)
        self.errors = refused.errors


class _CheckedRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = loads(await self.body())
            except Invalid as e:  # FastAPI's body parsing turns any other exception into a 400
                raise FieldError(e) from None
            except TooLarge as e:
                raise HTTPException(413, e.detail) from None
        return self._json


class CheckedRoute(APIRoute):
    """The API's route class: bodies are decoded with :func:`ember.server.services.codec.loads`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(_CheckedRequest(request.scope, request.receive))

        return route


class SafeJSONResponse(JSONResponse):
    """A JSON answer that never fails to encode (see :func:`encode`).

    Returning one from a route also skips FastAPI's ``jsonable_encoder`` walk over the content,
    which for a chart's thousands of numbers costs more than the query.
    """

    def render(self, content: Any) -> bytes:
        return encode(content)


def content_disposition(filename: str, kind: str = "attachment") -> str:
    """A ``Content-Disposition`` value for any file name (RFC 6266, with RFC 5987 ``filename*``).

    The plain ``filename`` keeps only printable ASCII other than ``"`` and ``\\``; the exact
    name travels UTF-8 percent-encoded in ``filename*``.

    Example:
        >>> content_disposition('caf\\u00e9 "x".csv')
        'attachment; filename="caf_ _x_.csv"; filename*=UTF-8\\'\\'caf%C3%A9%20%22x%22.csv'
    """
    fallback = "".join(c if " " <= c <= "~" and c not in '"\\' else "_" for c in filename) or "download"
    return f"{kind}; filename=\"{fallback}\"; filename*=UTF-8''{quote(safe(filename), safe='')}"
