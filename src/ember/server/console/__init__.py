"""The web console: server-rendered pages (Jinja2) over the tracking server, charts by plotly.js.

``mount(app)`` adds the pages under ``/ui``. Nothing is built with Node: the templates, the CSS
and the small scripts ship in this package with the chart libraries they use, vendored with their
licenses (uPlot for the run page, plotly.js at ``/ui/vendor/plotly.min.js``), so the console works
offline. Pages, scripts and chart data are gzipped; static files are cached (``assets.py``). See
``docs/console.md``.

Example:
    >>> from ember.server.app import create_app
    >>> from ember.server.console import mount
    >>> app = create_app(settings)
    >>> mount(app)                      # or mount(app, local_user="local") for `ember ui`
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fastapi import FastAPI
from fastapi.responses import RedirectResponse

from ember.server.console.assets import Compress, Static
from ember.server.console.session import PREFIX, load_secret
from ember.server.storage.settings import ServerError

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Progress:
    """How far the index has got: shown on every page while it works.

    Attributes:
        runs: run folders found in the store; indexed: how many are in the database (damaged
            ones included); damaged: how many are listed ``Damaged``.
        artifact_errors: ``"<folder>: <why>"`` for artifacts the console could not take.
        failure: what the last pass failed with, when it did (it is tried again).
        reading: runs listed whose files (metrics, output...) are still being read.
    """

    runs: int
    indexed: int
    damaged: int
    artifact_errors: tuple[str, ...] = ()
    failure: str | None = None
    reading: int = 0

    @property
    def done(self) -> bool:
        """Whether every run folder found is indexed."""
        return self.indexed >= self.runs


class Indexing(Protocol):
    """What the pages ask ``ember ui``'s index (:class:`ember.server.local.index.StoreIndex`): how far it has got."""

    def progress(self) -> Progress:
        """How far indexing has got (cheap: the pages call it on every render)."""
        ...


def mount(app: FastAPI, local_user: str | None = None, index: Indexing | None = None, token: str | None = None) -> None:
    """Serve the console on ``app`` under ``/ui``.

    Args:
        app: the server app from :func:`ember.server.app.create_app`.
        local_user: ``ember ui`` mode: every loopback request is this user, no login.
        index: ``ember ui`` mode: what keeps the database in step with the local store, in the
            background (pages never wait for it; they show its progress while it works).
        token: ``ember ui`` mode: the per-launch secret a browser must have opened the console
            with (``/ui/?token=...`` sets its cookie). Required with ``local_user``.

    Raises:
        ServerError: ``local_user`` without a ``token``.
    """
    from ember.server.console import artifact_pages, compare, data, image_pages, pages, run_edits, run_pages

    if local_user is not None and not token:
        raise ServerError("mount(local_user=...) needs the launch's token: the console must not open without it")
    app.state.console_local_user = local_user
    app.state.console_index = index
    app.state.console_token = token
    if getattr(app.state, "console_mounted", False):  # create_app mounted it; `ember ui` sets the mode
        return
    app.state.console_mounted = True
    app.state.console_secret = load_secret(app.state.settings.data_dir)
    app.include_router(pages.router)
    app.include_router(compare.router)
    app.include_router(artifact_pages.router)  # before run_pages: its artifact page is the one with previews
    app.include_router(image_pages.router)
    app.include_router(run_edits.router)
    app.include_router(run_pages.router)
    app.include_router(data.router)
    app.add_middleware(Compress)
    app.mount(f"{PREFIX}/static", Static(directory=HERE / "static"), name="console-static")

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse(f"{PREFIX}/", status_code=307)
