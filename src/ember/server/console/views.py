"""Rendering: the Jinja2 environment (autoescaped), the HTML error pages, the page route class."""

from __future__ import annotations

import math
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import quote, urlencode

import anyio
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.routing import APIRoute
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.exceptions import HTTPException as StarletteHTTPException

from ember._format import format_bytes, format_duration, format_time
from ember.server.api.errors import status_of
from ember.server.console.session import PREFIX, NeedLogin, csrf_token, local_entry, local_pass
from ember.server.storage.domain_errors import DomainError
from ember.track import query

_HERE = __import__("pathlib").Path(__file__).parent
env = Environment(
    loader=FileSystemLoader(_HERE / "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)


def fmt_time(value: str | None) -> Markup:
    """An ISO time as ``<time>`` reading 'YYYY-MM-DD HH:MM:SS UTC+02:00' (:func:`ember._format.format_time`):
    every page shows a time with its zone, as the run page does."""
    if not value:
        return Markup("—")
    return Markup('<time datetime="{}">{}</time>').format(value, format_time(value))


def fmt_duration(seconds: float | None) -> str:
    """Seconds as '4.2s', '3m 05s', '1h 02m' or '2d 03h' (:func:`ember._format.format_duration`, two units)."""
    return "—" if seconds is None else format_duration(seconds, parts=2, sep=" ")


def fmt_value(value: Any) -> str:
    """A metric or hparam value, short."""
    if value is None:
        return "—"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.4g}"
    return str(value)


def fmt_size(size: int | None) -> str:
    """Bytes as B, KiB, MiB, GiB or TiB (:func:`ember._format.format_bytes`)."""
    return "—" if size is None else format_bytes(size)


def metric_sort(key: str, agg: str = "last") -> str:
    """The sort key of a metric column (``TYPE/NAME``) by its last, best, min or max value, as the filter
    language writes the field (``m:val/acc.best``; an odd name quoted)."""
    return str(query.Field("m", key, agg))


env.filters.update(time=fmt_time, duration=fmt_duration, value=fmt_value, size=fmt_size, urlpath=quote)
env.filters.update(metric_sort=metric_sort)
env.globals.update(PREFIX=PREFIX, urlencode=urlencode)


def render(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """Render a page with the viewer, the CSRF token and the mode in its context."""
    response = HTMLResponse("", status_code=status_code)
    context.setdefault("user", None)
    index = request.app.state.console_index
    context.update(
        request=request,
        csrf=csrf_token(request, response),
        local=request.app.state.console_local_user is not None,
        indexing=index.progress() if index is not None and local_pass(request) else None,
    )
    # "replace": a lone surrogate stored before the server refused them must not fail the page.
    response.body = env.get_template(template).render(**context).encode("utf-8", "replace")
    response.headers["content-length"] = str(len(response.body))
    secure(response)
    return response


def secure(response: Response) -> None:
    """Headers every console answer carries."""
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers.setdefault("Cache-Control", "no-store")


_TITLES = {
    401: "Please log in",
    403: "You may not do this",
    404: "Not found, or not shared with you",
    413: "Too large",
    422: "That request is not understood",
}


def crumbs(path: str) -> list[tuple[str, str]]:
    """'/alice/a/b' -> [('alice', '/alice'), ('a', '/alice/a'), ('b', '/alice/a/b')]."""
    parts = path.strip("/").split("/") if path.strip("/") else []
    return [(p, "/" + "/".join(parts[: i + 1])) for i, p in enumerate(parts)]


class ConsoleRoute(APIRoute):
    """Page routes: errors become readable HTML pages, a missing login the login page.

    With ``json_errors`` (data routes used by the page scripts) errors stay JSON.
    """

    json_errors = False

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        json_errors = self.json_errors

        async def route(request: Request) -> Response:
            if request.app.state.console_local_user is not None:
                entered = local_entry(request)
                if entered is not None:
                    return entered
            try:
                return await handler(request)
            except NeedLogin:
                if json_errors:
                    return JSONResponse({"detail": "log in first"}, status_code=401)
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"{PREFIX}/login?{urlencode({'next': target})}", status_code=303)
            except (StarletteHTTPException, DomainError, RequestValidationError) as e:
                if isinstance(e, RequestValidationError):
                    code, detail = 422, _validation(e)
                else:
                    code = status_of(e) if isinstance(e, DomainError) else e.status_code
                    detail = str(e.detail)
                if json_errors:
                    return JSONResponse({"detail": detail}, status_code=code)
                title = _TITLES.get(code, "Something went wrong")
                return await anyio.to_thread.run_sync(
                    lambda: render(request, "error.html", status_code=code, title=title, detail=detail, code=code)
                )

        return route


class DataRoute(ConsoleRoute):
    """Routes the page scripts call: JSON errors."""

    json_errors = True


def _validation(e: RequestValidationError) -> str:
    first = e.errors()[0] if e.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("query", "body"))
    return f"{where or 'request'}: {first.get('msg', 'invalid')}"
