"""The ASGI app: ``create_app(settings)`` wires the database, the blob store, the routes and errors.

Example:
    >>> from ember.server.app import create_app
    >>> from ember.server.storage.settings import Settings
    >>> app = create_app(Settings.make(data_dir="/tmp/ember-server"))   # serve with uvicorn
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

import anyio
import anyio.to_thread
from fastapi import APIRouter, FastAPI

from ember.server import API_PREFIX
from ember.server.api import errors
from ember.server.api.guard import Hardened, HostCheck
from ember.server.api.wire import SafeJSONResponse
from ember.server.services import blobs, runs
from ember.server.services.blobs import BlobStore
from ember.server.services.series import SeriesReader
from ember.server.storage.db import check_database, make_engine, make_reader, migrate, prepare, session_factory
from ember.server.storage.settings import Settings

API_VERSION = "1"
log = logging.getLogger("ember.server")


def collect_blobs(app: FastAPI) -> int:
    """Purge the runs whose time in the trash is over, then remove the blobs no artifact lists whose
    uploads' grace period has passed; return how many blobs."""
    with app.state.sessions() as session, session.begin():
        purged = runs.purge_expired(session)
        if purged:
            log.info("purged %d runs whose %d days in the trash were over", purged, runs.TRASH_DAYS)
    with app.state.sessions() as session, session.begin():
        return blobs.collect(session, app.state.blobs)


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Collect unreferenced blobs now and then, in a worker thread, while the app serves."""
    period = max(60.0, min(3600.0, app.state.settings.blob_grace_s / 2))

    async def collector() -> None:
        while True:
            try:
                gone = await anyio.to_thread.run_sync(collect_blobs, app)
            except Exception:  # logged and retried next period: collection must not stop serving
                log.exception("collecting unreferenced blobs failed")
            else:
                if gone:
                    log.info("removed %d unreferenced blobs", gone)
            await anyio.sleep(period)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(collector)
        yield
        tasks.cancel_scope.cancel()


def create_app(settings: Settings, schema: Literal["check", "upgrade", "skip"] = "check") -> FastAPI:
    """Build the server app for ``settings``.

    Args:
        settings: database URL, data folder and size limits.
        schema: ``"check"``: create the newest schema on an empty database and refuse an older
            one with the command that upgrades it (:func:`ember.server.storage.db.prepare`);
            ``"upgrade"``: bring an older schema up to date (``ember ui``, whose database is its
            own); ``"skip"``: ``ember server``'s workers, whose parent process checked.

    Returns:
        The FastAPI app; the OpenAPI schema is at ``/api/v1/openapi.json``; the Swagger UI page
        at ``/api/v1/docs`` only with ``settings.api_docs`` (it loads its script from a CDN).
    """
    from ember.server.api import artifact_routes, folder_routes, image_routes, run_routes

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.db_url)
    check_database(engine)
    if schema == "upgrade":
        migrate(engine)
    elif schema == "check":
        prepare(engine)
    app = FastAPI(
        title="ember tracking server",
        version=API_VERSION,
        description="Runs, metrics, artifacts and lineage uploaded from ember's local store. "
        "Every route needs 'Authorization: Bearer <API key>'.",
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=f"{API_PREFIX}/docs" if settings.api_docs else None,
        redoc_url=None,
        default_response_class=SafeJSONResponse,
        lifespan=_lifespan,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessions = session_factory(engine)
    app.state.read_engine = make_reader(engine)
    app.state.read_sessions = session_factory(app.state.read_engine)
    app.state.blobs = BlobStore(settings.data_dir)
    app.state.blobs.clean_tmp()
    app.state.series = SeriesReader(app.state.sessions)
    api = APIRouter(prefix=API_PREFIX)
    api.include_router(folder_routes.router)
    api.include_router(run_routes.router)
    api.include_router(image_routes.router)
    api.include_router(run_routes.search)
    api.include_router(run_routes.trash)
    api.include_router(artifact_routes.blobs)
    api.include_router(artifact_routes.router)
    app.include_router(api)
    if all(importlib.util.find_spec(m) for m in ("jinja2", "python_multipart")):  # pip install 'ember[console]'
        from ember.server.console import mount

        mount(app)
    errors.install(app)
    # The last added is the outermost: the Host check first, then the size limit.
    app.add_middleware(Hardened)
    app.add_middleware(
        errors.BodyLimit,
        default=settings.max_body_bytes,
        limits={f"{API_PREFIX}/blobs/": settings.max_blob_bytes},
    )
    if settings.allowed_hosts is not None:
        app.add_middleware(HostCheck, allowed=settings.allowed_hosts)
    return app


def app_from_env() -> FastAPI:
    """The app for uvicorn's worker processes, from the ``$EMBER_SERVER_*`` variables."""
    return create_app(Settings.make(), schema="skip")


def iter_routes(app: FastAPI) -> list[tuple[str, set[str]]]:
    """Every (path, methods) the app serves, including those of included routers.

    Newer FastAPI versions keep included routers as one lazy entry of ``app.routes``; this walks
    into them so that tests enumerate every route, a new one included.
    """
    out: list[tuple[str, set[str]]] = []
    for route in app.routes:
        contexts = getattr(route, "effective_route_contexts", None)
        if contexts is not None:
            out += [(c.path, set(c.methods or ())) for c in contexts()]
        elif hasattr(route, "path"):
            out.append((route.path, set(getattr(route, "methods", None) or ())))
    return out
