"""ASGI middleware every answer passes: the Host check, ``Cache-Control``, NUL in URLs, and 500s.

- :class:`HostCheck` answers 400 to a ``Host`` header naming another host than the allowed
  ones. A page on ``evil.example`` whose name an attacker re-points at 127.0.0.1 (DNS
  rebinding) reaches a loopback server with ``Host: evil.example``: refused.
- :class:`Hardened` adds ``Cache-Control: no-store`` (API answers hold keys and private data;
  nothing of them may stay in a browser's or a proxy's cache) and ``X-Content-Type-Options``
  to every answer but the console's static files, refuses a NUL (``%00``) anywhere in the URL
  with a 422 (PostgreSQL cannot compare text holding it), and turns an unexpected exception
  into a JSON 500 *without* raising it on: raised, the server closes the connection, and the
  client's next request on it fails with "connection reset".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("ember.server")
_STATIC = ("/ui/static/", "/ui/vendor/")


def host_name(header: str) -> str:
    """The host of a ``Host`` header: lower case, without port, IPv6 without brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class HostCheck:
    """Answer 400 unless the request's ``Host`` names one of ``allowed`` (names without port)."""

    def __init__(self, app: ASGIApp, allowed: Iterable[str]) -> None:
        self.app = app
        self.allowed = frozenset(allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers", [])).get(b"host", b"").decode("latin-1")
        if host_name(header) in self.allowed:
            await self.app(scope, receive, send)
            return
        detail = (
            f"this server does not answer to the host name {header[:100]!r}: open it by one of "
            f"{', '.join(sorted(self.allowed))} (`ember server --allowed-hosts` adds names)"
        )
        await _json(send, 400, detail)


class Hardened:
    """``Cache-Control: no-store`` and ``nosniff`` on answers, 422 for NUL in URLs, 500s that keep the connection."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        raw = scope.get("raw_path") or path.encode()
        if b"%00" in raw or b"%00" in scope.get("query_string", b"") or "\x00" in path:
            await _json(send, 422, "the URL holds a NUL character (%00), which no name or value may contain")
            return
        static = path.startswith(_STATIC)
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                if not static and b"cache-control" not in names:
                    headers.append((b"cache-control", b"no-store"))
                if b"x-content-type-options" not in names:
                    headers.append((b"x-content-type-options", b"nosniff"))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            if started:  # half an answer is out: only closing the connection can tell the client
                raise
            log.exception("unexpected error on %s %s", scope.get("method"), path)
            await _json(send_with_headers, 500, "internal server error (the server log has the details)")


async def _json(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
