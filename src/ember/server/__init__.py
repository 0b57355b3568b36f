"""The ember tracking server: runs, metrics, artifacts and lineage uploaded from local stores.

An ASGI app (FastAPI) over SQLAlchemy 2: SQLite by default (one machine), PostgreSQL by URL
(a team, several server processes behind one database). Artifact files are stored
content-addressed by sha256 under the data folder. The REST API lives under ``/api/v1``; the
OpenAPI schema is served at ``/api/v1/openapi.json``. See ``docs/server.md``.

Importing this package is cheap; :func:`ember.server.app.create_app` imports FastAPI.
"""

from __future__ import annotations

API_PREFIX = "/api/v1"

__all__ = ["API_PREFIX"]
