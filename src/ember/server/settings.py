"""Server settings: where the database and the blobs are, and the request size limits."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ember.errors import EmberError

ENV_DB = "EMBER_SERVER_DB"
ENV_DATA = "EMBER_SERVER_DATA"
ENV_MAX_BODY = "EMBER_SERVER_MAX_BODY_BYTES"
ENV_MAX_BLOB = "EMBER_SERVER_MAX_BLOB_BYTES"
DEFAULT_DATA = ".ember-server"
MiB = 1 << 20


class ServerError(EmberError, ValueError):
    """The server cannot start or an administrative command got bad input."""


@dataclass(frozen=True)
class Settings:
    """What a server process needs to know.

    Args:
        data_dir: the folder holding blobs (and the SQLite database by default).
        db_url: a SQLAlchemy URL; default ``sqlite:///<data_dir>/ember.db``.
        max_body_bytes: the largest JSON request accepted (413 above it).
        max_blob_bytes: the largest artifact file accepted (413 above it).
        max_batch_points: the most metric records in one request (413 above it).

    Example:
        >>> Settings.make(data_dir="/srv/ember", db_url="postgresql+psycopg://ember@db/ember")
    """

    data_dir: Path
    db_url: str
    max_body_bytes: int = 32 * MiB
    max_blob_bytes: int = 8192 * MiB
    max_batch_points: int = 20_000

    @classmethod
    def make(
        cls,
        data_dir: str | os.PathLike[str] | None = None,
        db_url: str | None = None,
        max_body_bytes: int | None = None,
        max_blob_bytes: int | None = None,
    ) -> Settings:
        """Settings from arguments, falling back to ``$EMBER_SERVER_*`` and the defaults."""
        data = Path(data_dir or os.environ.get(ENV_DATA) or DEFAULT_DATA).expanduser().absolute()
        url = db_url or os.environ.get(ENV_DB) or f"sqlite:///{data / 'ember.db'}"
        if not url.startswith(("sqlite", "postgresql")):
            raise ServerError(
                f"database URL {url.split('@')[-1]!r} is not supported: use sqlite:///PATH or "
                "postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB"
            )
        body = max_body_bytes if max_body_bytes is not None else _env_int(ENV_MAX_BODY, 32 * MiB)
        blob = max_blob_bytes if max_blob_bytes is not None else _env_int(ENV_MAX_BLOB, 8192 * MiB)
        if body <= 0 or blob <= 0:
            raise ServerError(f"size limits must be positive, got max_body_bytes={body}, max_blob_bytes={blob}")
        return cls(data_dir=data, db_url=url, max_body_bytes=body, max_blob_bytes=blob)

    def export_env(self) -> None:
        """Put these settings in the environment, for worker processes that rebuild them."""
        os.environ[ENV_DATA] = str(self.data_dir)
        os.environ[ENV_DB] = self.db_url
        os.environ[ENV_MAX_BODY] = str(self.max_body_bytes)
        os.environ[ENV_MAX_BLOB] = str(self.max_blob_bytes)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ServerError(f"${name}={raw!r} is not a whole number of bytes") from None
