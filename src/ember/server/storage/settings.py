"""Server settings: where the database and the blobs are, size limits, quota, allowed hosts."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ember.errors import EmberError

ENV_DB = "EMBER_SERVER_DB"
ENV_DATA = "EMBER_SERVER_DATA"
ENV_MAX_BODY = "EMBER_SERVER_MAX_BODY_BYTES"
ENV_MAX_BLOB = "EMBER_SERVER_MAX_BLOB_BYTES"
ENV_QUOTA = "EMBER_SERVER_QUOTA_BYTES"
ENV_MAX_IMAGES = "EMBER_SERVER_MAX_RUN_IMAGES"
ENV_MAX_LOG = "EMBER_SERVER_MAX_LOG_BYTES"
ENV_MAX_RUNS = "EMBER_SERVER_MAX_USER_RUNS"
ENV_MAX_FOLDERS = "EMBER_SERVER_MAX_USER_FOLDERS"
ENV_MAX_METRICS = "EMBER_SERVER_MAX_RUN_METRICS"
ENV_GRACE = "EMBER_SERVER_BLOB_GRACE_S"
ENV_HOSTS = "EMBER_SERVER_ALLOWED_HOSTS"
ENV_DOCS = "EMBER_SERVER_API_DOCS"
DEFAULT_DATA = ".ember-server"
MiB = 1 << 20
DAY_S = 24 * 3600
DEFAULT_MAX_LOG = 64 * MiB
DEFAULT_MAX_RUNS = 100_000
DEFAULT_MAX_FOLDERS = 100_000
DEFAULT_MAX_METRICS = 10_000
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
"""The names a loopback-only server answers to (``ember ui``; ``ember server`` by default)."""


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
        quota_bytes: the most bytes one user may hold, artifact files, run images, run output and
            metric points (each at ``ember.server.services.blobs.POINT_BYTES``) together (413 above
            it); None: no quota.
        max_run_images: the most images one run may hold (413 above it).
        max_log_bytes: the most bytes of output (stdout.log) one run may hold (413 above it).
        max_user_runs: the most runs one user's folder tree may hold (413 above it); None: no limit.
        max_user_folders: the most folders one user's tree may hold, their home included (413
            above it); None: no limit.
        max_run_metrics: the most distinct metrics (type and name) one run may hold (413 above
            it); None: no limit.
        blob_grace_s: how long uploaded bytes no artifact refers to are kept (the time a client
            has between uploading a blob and the artifact that lists it).
        allowed_hosts: the ``Host`` header names (without port) the server answers; others get
            400 (against DNS rebinding). None: any. ``ember server`` defaults to loopback names.
        api_docs: serve the Swagger UI page at ``/api/v1/docs`` (it loads its script from a CDN).

    Example:
        >>> Settings.make(data_dir="/srv/ember", db_url="postgresql+psycopg://ember@db/ember")
    """

    data_dir: Path
    db_url: str
    max_body_bytes: int = 32 * MiB
    max_blob_bytes: int = 8192 * MiB
    max_batch_points: int = 20_000
    quota_bytes: int | None = None
    blob_grace_s: float = DAY_S
    allowed_hosts: tuple[str, ...] | None = None
    api_docs: bool = False
    max_run_images: int = 10_000
    max_log_bytes: int = DEFAULT_MAX_LOG
    max_user_runs: int | None = DEFAULT_MAX_RUNS
    max_user_folders: int | None = DEFAULT_MAX_FOLDERS
    max_run_metrics: int | None = DEFAULT_MAX_METRICS

    @classmethod
    def make(
        cls,
        data_dir: str | os.PathLike[str] | None = None,
        db_url: str | None = None,
        max_body_bytes: int | None = None,
        max_blob_bytes: int | None = None,
        quota_bytes: int | None = None,
        blob_grace_s: float | None = None,
        allowed_hosts: tuple[str, ...] | list[str] | None = None,
        api_docs: bool | None = None,
        max_run_images: int | None = None,
        max_log_bytes: int | None = None,
        max_user_runs: int | None = None,
        max_user_folders: int | None = None,
        max_run_metrics: int | None = None,
    ) -> Settings:
        """Settings from arguments, falling back to ``$EMBER_SERVER_*`` and the defaults.

        The counts (``max_user_runs``, ``max_user_folders``, ``max_run_metrics``) take 0 for no
        limit, as ``quota_bytes`` does.

        Raises:
            ServerError: an unsupported database URL, or a limit that is not positive.
        """
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
        quota = quota_bytes if quota_bytes is not None else _env_int(ENV_QUOTA, 0) or None
        if quota is not None and quota <= 0:
            raise ServerError(f"quota_bytes must be positive (or None for no quota), got {quota}")
        grace = blob_grace_s if blob_grace_s is not None else float(_env_int(ENV_GRACE, DAY_S))
        if grace < 0:
            raise ServerError(f"blob_grace_s must be 0 or more seconds, got {grace}")
        hosts = tuple(allowed_hosts) if allowed_hosts is not None else _env_hosts()
        if hosts is not None:
            hosts = check_hosts(hosts)
        docs = api_docs if api_docs is not None else os.environ.get(ENV_DOCS) == "1"
        images = max_run_images if max_run_images is not None else _env_int(ENV_MAX_IMAGES, 10_000)
        if images <= 0:
            raise ServerError(f"max_run_images must be positive, got {images}")
        log = max_log_bytes if max_log_bytes is not None else _env_int(ENV_MAX_LOG, DEFAULT_MAX_LOG)
        if log <= 0:
            raise ServerError(f"max_log_bytes must be positive, got {log}")
        counts = (
            _count(max_user_runs, ENV_MAX_RUNS, DEFAULT_MAX_RUNS, "max_user_runs"),
            _count(max_user_folders, ENV_MAX_FOLDERS, DEFAULT_MAX_FOLDERS, "max_user_folders"),
            _count(max_run_metrics, ENV_MAX_METRICS, DEFAULT_MAX_METRICS, "max_run_metrics"),
        )
        return cls(data, url, body, blob, 20_000, quota, grace, hosts, docs, images, log, *counts)

    def export_env(self) -> None:
        """Put these settings in the environment, for worker processes that rebuild them."""
        os.environ[ENV_DATA] = str(self.data_dir)
        os.environ[ENV_DB] = self.db_url
        os.environ[ENV_MAX_BODY] = str(self.max_body_bytes)
        os.environ[ENV_MAX_BLOB] = str(self.max_blob_bytes)
        os.environ[ENV_QUOTA] = str(self.quota_bytes or 0)
        os.environ[ENV_GRACE] = str(int(self.blob_grace_s))
        os.environ[ENV_HOSTS] = "*" if self.allowed_hosts is None else ",".join(self.allowed_hosts)
        os.environ[ENV_DOCS] = "1" if self.api_docs else "0"
        os.environ[ENV_MAX_IMAGES] = str(self.max_run_images)
        os.environ[ENV_MAX_LOG] = str(self.max_log_bytes)
        os.environ[ENV_MAX_RUNS] = str(self.max_user_runs or 0)
        os.environ[ENV_MAX_FOLDERS] = str(self.max_user_folders or 0)
        os.environ[ENV_MAX_METRICS] = str(self.max_run_metrics or 0)


def check_hosts(hosts: tuple[str, ...] | list[str]) -> tuple[str, ...] | None:
    """Normalise ``--allowed-hosts`` names (lower case, no port, IPv6 without brackets); ``*``: any.

    Raises:
        ServerError: a name holding a port, a path, spaces or nothing.
    """
    out = []
    for raw in hosts:
        name = raw.strip().lower()
        if name == "*":
            return None
        if name.startswith("[") and name.endswith("]"):
            name = name[1:-1]
        if not name or any(c in name for c in "/ @?#") or (":" in name and name.count(":") == 1):
            raise ServerError(f"allowed host {raw!r}: give a host name or address without port or path, or '*'")
        out.append(name)
    return tuple(dict.fromkeys(out))


def _env_hosts() -> tuple[str, ...] | None:
    raw = os.environ.get(ENV_HOSTS)
    if not raw:
        return None
    return check_hosts(raw.split(","))


def _count(given: int | None, env: str, default: int, what: str) -> int | None:
    """A count limit from its argument, else ``$env``, else ``default``; 0 is no limit (None)."""
    value = given if given is not None else _env_int(env, default)
    if value < 0:
        raise ServerError(f"{what} must be 0 (no limit) or more, got {value}")
    return value or None


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ServerError(f"${name}={raw!r} is not a whole number") from None
