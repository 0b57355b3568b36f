"""``ember ui``: the console over a local store, on loopback, without login.

The design reuses the server whole instead of a second, read-only data layer: on start a
throw-away server (SQLite in a temporary folder) is created with one user, ``local``, and a
background thread indexes the store into it (:class:`ember.server.local.index.StoreIndex`):
newest runs first on a cold start, then, every second, only what changed. Pages never wait for
it, so the first page answers at once and a page costs the same at 100 or 100,000 runs; a
running run's charts follow it within about a second. The store itself is only read.

No login does not mean open: it answers only ``Host`` names of loopback (a page of another site
whose name resolves to 127.0.0.1 is refused), and only a browser that opened the URL it prints,
which carries a per-launch token (see :mod:`ember.server.console.session`).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import tempfile
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from ember.track.layout import ARTIFACTS_DIR, RUNS_DIR

if TYPE_CHECKING:
    from fastapi import FastAPI

    from ember.server.storage.settings import Settings

LOCAL_USER = "local"
log = logging.getLogger("ember.server")


def build_app(store: str | os.PathLike[str] | None, port: int, data_dir: Path) -> tuple[FastAPI, str]:
    """The ``ember ui`` app over ``store`` (its database in ``data_dir``) and the URL to print.

    The app's index (``app.state.console_index``, a
    :class:`~ember.server.local.index.StoreIndex`) is not started: :func:`serve` starts it;
    a test calls its ``step()``.

    Returns:
        The app and ``http://127.0.0.1:PORT/ui/?token=...``, the only way in. A ``data_dir``
        kept from an earlier start (``ember ui --data``) is used again: its user gets a new key,
        and the index brings the database up to date with the store.

    Raises:
        ServerError: the store holds no runs/ or artifacts/.
    """
    from ember.server.app import create_app
    from ember.server.console import mount
    from ember.server.local.index import StoreIndex
    from ember.server.storage.settings import LOOPBACK_HOSTS, ServerError, Settings
    from ember.track.client import Credentials
    from ember.track.layout import resolve_home

    root = resolve_home(store)
    if not (root / RUNS_DIR).is_dir() and not (root / ARTIFACTS_DIR).is_dir():
        raise ServerError(f"{root} holds no runs/ or artifacts/: pass --store DIR (the folder holding runs/)")
    # Your own store: no count limits (0), as ``Uploads(own_store=True)`` bounds nothing of it.
    settings = Settings.make(
        data_dir=data_dir,
        db_url=f"sqlite:///{data_dir / 'ui.db'}",
        allowed_hosts=LOOPBACK_HOSTS,
        max_user_runs=0,
        max_user_folders=0,
        max_run_metrics=0,
    )
    key = _local_key(settings)
    app = create_app(settings, schema="upgrade")
    url = f"http://127.0.0.1:{port}"
    token = secrets.token_urlsafe(32)
    index = StoreIndex(app, root, LOCAL_USER, Credentials(url, key))
    mount(app, local_user=LOCAL_USER, index=index, token=token)
    app.state.console_root = root
    return app, f"{url}/ui/?token={token}"


def _local_key(settings: Settings) -> str:
    """A key of the user ``local``: a new database gets the user; one kept by ``--data`` (a restart) is
    upgraded to the newest schema (it is ember ui's own) and its user gets a new key."""
    from ember.server.services import admin

    if not Path(settings.data_dir, "ui.db").is_file():
        return admin.init(settings, LOCAL_USER, upgrade=True)
    from ember.server.storage.db import make_engine, migrate

    engine = make_engine(settings.db_url)  # ember ui's own database: brought up to date, no question asked
    try:
        migrate(engine)
    finally:
        engine.dispose()
    return admin.create_key(settings, LOCAL_USER, "ember ui")


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM ends ``ember ui`` as Ctrl-C does: through its ``finally`` blocks (the temporary folder goes)."""
    raise SystemExit(128 + signum)


def serve(store: str | os.PathLike[str] | None, port: int = 8766, data: str | None = None) -> int:
    """Serve the console over ``store`` on ``127.0.0.1:port`` until interrupted.

    Args:
        store: the local store root (default ``$EMBER_HOME`` or ``./.ember``).
        port: the loopback port.
        data: where the throw-away server keeps its database (default: a temporary folder,
            removed on exit).

    Raises:
        ServerError: ``port`` is taken (checked first: nothing is printed or created), or the
            store holds no runs/ or artifacts/.
    """
    import uvicorn

    listening = listen(port)
    # uvicorn stops on SIGTERM, then raises the signal again with the handler it found: the
    # default one would kill the process before the temporary folder is removed.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        folder = Path(data) if data else Path(tempfile.mkdtemp(prefix="ember-ui-"))
    except BaseException:
        listening.close()
        raise
    try:
        app, url = build_app(store, port, folder)
        print(
            f"ember ui: {app.state.console_root} at\n    {url}\n"
            "(loopback only; open this link: its token is the login, valid until ember ui stops; Ctrl-C stops)",
            flush=True,
        )
        app.state.console_index.start()
        try:
            config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
            uvicorn.Server(config).run(sockets=[listening])
        finally:
            app.state.console_index.stop()
    finally:
        listening.close()
        if not data:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


def listen(port: int) -> socket.socket:
    """A socket bound to ``127.0.0.1:port``, taken before anything else so that a busy port fails at once.

    Before, ``ember ui`` printed its link, started indexing and only then found the port taken
    (uvicorn logged it and the process lingered with its index thread).

    Raises:
        ServerError: the port is in use (or may not be bound), naming it and the fix.
    """
    from ember.server.storage.settings import ServerError

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if os.name != "nt":  # as uvicorn binds: a port in TIME_WAIT after a restart is free to use
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as e:
        sock.close()
        raise ServerError(
            f"ember ui cannot listen on 127.0.0.1:{port}: {e.strerror or e} (another ember ui or server on it?); "
            "stop that one or pass --port N"
        ) from None
    return sock
