"""``ember ui``: the console over a local store, on loopback, without login.

The design reuses the server whole instead of a second, read-only data layer: on start a
throw-away server (SQLite in a temporary folder) is created with one user, ``local``, and the
store is uploaded into it with the ordinary, incremental upload protocol. Before each console
request the store is synced again; only what changed since the last sync is sent (a run whose
files have not changed is skipped without a request), so a running run's charts follow it
live. The store itself is only read.

No login does not mean open: it answers only ``Host`` names of loopback (a page of another site
whose name resolves to 127.0.0.1 is refused), and only a browser that opened the URL it prints,
which carries a per-launch token (see :mod:`ember.server.console.session`).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ember.track._fs import ARTIFACTS_DIR, RUNS_DIR

if TYPE_CHECKING:
    from fastapi import FastAPI

LOCAL_USER = "local"
log = logging.getLogger("ember.server")


def _signature(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """Names, sizes and modification times of a run's or artifact's files: changes when it does."""
    out = []
    for path in sorted(folder.rglob("*")):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        if path.is_file():
            out.append((str(path.relative_to(folder)), st.st_size, st.st_mtime_ns))
    return tuple(out)


class StoreSync:
    """Uploads what changed in a local store to the ``ember ui`` server, at most every ``min_interval`` s.

    Example:
        >>> sync = StoreSync(Path(".ember"), "http://127.0.0.1:8766", key)
        >>> sync()      # before a page is rendered
    """

    def __init__(self, store: Path, host: str, api_key: str, min_interval: float = 0.0) -> None:
        self.store, self.host, self.api_key = store, host, api_key
        self.min_interval = min_interval
        self.errors: dict[str, str] = {}
        self._seen: dict[Path, tuple[tuple[str, int, int], ...]] = {}
        self._lock = threading.Lock()
        self._last = 0.0

    def __call__(self) -> None:
        with self._lock:
            if time.monotonic() - self._last < self.min_interval:
                return
            self._sync()
            self._last = time.monotonic()

    def _sync(self) -> None:
        from ember.track.client import Client, Credentials, UploadError, upload_artifact, upload_run

        changed = []
        for kind, meta in ((ARTIFACTS_DIR, "artifact.json"), (RUNS_DIR, "run.json")):
            for folder in sorted(p for p in (self.store / kind).glob("*") if (p / meta).is_file()):
                signature = _signature(folder)
                if self._seen.get(folder) != signature:
                    changed.append((kind, folder, signature))
        if not changed:
            return
        with Client(Credentials(self.host, self.api_key), timeout=120.0) as client:
            for kind, folder, signature in changed:
                try:
                    if kind == ARTIFACTS_DIR:
                        upload_artifact(folder, "default", True, "new", client)
                    else:
                        upload_run(folder, None, True, "new", client, artifacts=False)
                except UploadError as e:
                    self.errors[folder.name] = str(e)
                    log.warning("ember ui: could not load %s: %s", folder, e)
                    continue
                self.errors.pop(folder.name, None)
                self._seen[folder] = signature


def build_app(store: str | os.PathLike[str] | None, port: int, data_dir: Path) -> tuple[FastAPI, str]:
    """The ``ember ui`` app over ``store`` (its database in ``data_dir``) and the URL to print.

    Returns:
        The app and ``http://127.0.0.1:PORT/ui/?token=...``, the only way in.

    Raises:
        ServerError: the store holds no runs/ or artifacts/.
    """
    from ember.server import admin
    from ember.server.app import create_app
    from ember.server.console import mount
    from ember.server.settings import LOOPBACK_HOSTS, ServerError, Settings
    from ember.track._fs import resolve_home

    root = resolve_home(store)
    if not (root / RUNS_DIR).is_dir() and not (root / ARTIFACTS_DIR).is_dir():
        raise ServerError(f"{root} holds no runs/ or artifacts/: pass --store DIR (the folder holding runs/)")
    settings = Settings.make(data_dir=data_dir, db_url=f"sqlite:///{data_dir / 'ui.db'}", allowed_hosts=LOOPBACK_HOSTS)
    key = admin.init(settings, LOCAL_USER)
    app = create_app(settings)
    url = f"http://127.0.0.1:{port}"
    token = secrets.token_urlsafe(32)
    mount(app, local_user=LOCAL_USER, sync=StoreSync(root, url, key), token=token)
    app.state.console_root = root
    return app, f"{url}/ui/?token={token}"


def serve(store: str | os.PathLike[str] | None, port: int = 8766, data: str | None = None) -> int:
    """Serve the console over ``store`` on ``127.0.0.1:port`` until interrupted.

    Args:
        store: the local store root (default ``$EMBER_HOME`` or ``./.ember``).
        port: the loopback port.
        data: where the throw-away server keeps its database (default: a temporary folder,
            removed on exit).
    """
    import uvicorn

    folder = Path(data) if data else Path(tempfile.mkdtemp(prefix="ember-ui-"))
    try:
        app, url = build_app(store, port, folder)
        print(
            f"ember ui: {app.state.console_root} at\n    {url}\n"
            "(loopback only; open this link: its token is the login, valid until ember ui stops; Ctrl-C stops)",
            flush=True,
        )
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
    finally:
        if not data:
            shutil.rmtree(folder, ignore_errors=True)
    return 0
