"""How the console's static files and pages travel: cache headers and gzip.

* :class:`Static` serves ``console/static``. A URL carrying ``?v=`` (the :data:`VERSION` of the
  files, which run.html puts on its scripts) is cached for a year: a new ember changes the URL.
  Other static URLs are revalidated (``no-cache``: a 304 when unchanged).
* :class:`Compress` gzips the console's pages, scripts and chart data (plotly.js: 4.8 MB to
  1.5 MB; a 1,000,000-point run's series: ~5 to ~1.5 kB per 100 points), and nothing else: never a
  download (an artifact's file, a metrics CSV/JSON, a whole output log), which streams and must
  reach the client as stored, nor the API.

Example:
    >>> app.add_middleware(Compress)
    >>> app.mount("/ui/static", Static(directory=HERE / "static"))
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from starlette.middleware.gzip import GZipMiddleware
from starlette.responses import Response
from starlette.staticfiles import PathLike, StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from ember.server.console.session import PREFIX

STATIC = Path(__file__).parent / "static"


def _version() -> str:
    """A digest of the static files' names, sizes and times: changes when any file does."""
    digest = hashlib.sha256()
    for path in sorted(STATIC.iterdir()):
        stat = path.stat()
        digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()[:12]


VERSION = _version()
YEAR = "public, max-age=31536000, immutable"
# Downloads (artifact files, metrics.csv/json, the whole output log) and media (already compressed).
_DOWNLOAD = re.compile(r"/files/|/media/|\.(csv|json|log)$|/download")


class Static(StaticFiles):
    """StaticFiles with cache headers: a year for versioned URLs (``?v=``), else revalidate."""

    def file_response(
        self, full_path: PathLike, stat_result: os.stat_result, scope: Scope, status_code: int = 200
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        versioned = b"v=" in scope.get("query_string", b"")
        response.headers["Cache-Control"] = YEAR if versioned else "no-cache"
        return response


class Compress:
    """Gzip for the console's own answers (pages, scripts, chart series); never a download."""

    def __init__(self, app: ASGIApp, minimum_size: int = 1024) -> None:
        self.app = app
        self.gzip = GZipMiddleware(app, minimum_size=minimum_size, compresslevel=5)  # 9 costs 3x the time, ~5% smaller

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path.startswith(PREFIX + "/") and not _DOWNLOAD.search(path):
            await self.gzip(scope, receive, send)
        else:
            await self.app(scope, receive, send)
