"""The tables: users, API keys, folders, shares, runs, metric points and their block summaries, logs,
artifacts, blobs and their uploaders, lineage.

Runs and artifacts are two kinds of node, each with its own ids: whatever is keyed by a node
(cursors, lineage ends, shares) is keyed by its kind and its id (or primary key), so a run and
an artifact never share a row (migration 0008).

A folder tree has one owner: the user whose home ``/<user>`` is its root. ``owner_id`` of every
folder, run and artifact in it is that user, whoever created them (migration 0004).

The schema is created and changed only by the Alembic migrations in ``migrations/versions``;
these classes must match them (a test compares the two).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

ID = String(32)  # uuid4 hex, as the local store writes it


def now() -> datetime:
    """The current time in UTC."""
    return datetime.now(timezone.utc)


def aware(when: datetime) -> datetime:
    """A datetime read from the database, in UTC: SQLite gives back naive ones, written in UTC."""
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


class Base(DeclarativeBase):
    """Declarative base of every table."""


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # A bound on the bytes the user's storage holds (``blobs.usage``), never below it; NULL: not
    # known, summed at the next check. Raised by every write that adds to the storage, under the
    # lock of this row, in its transaction; left as it is by what frees bytes (migration 0013).
    stored_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key_id: Mapped[str] = mapped_column(String(16), unique=True)  # public part, for look-up
    digest: Mapped[str] = mapped_column(String(64))  # sha256 hex of the whole key
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    label: Mapped[str] = mapped_column(String(100), default="")
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revoked: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # The key that minted this one through the API (migration 0009): this key expires no later,
    # and revoking that key revokes this one too. NULL for keys an admin made on the server.
    parent_id: Mapped[int | None] = mapped_column(
        ForeignKey("api_keys.id", ondelete="CASCADE"), nullable=True, index=True
    )


class Folder(Base):
    __tablename__ = "folders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    path: Mapped[str] = mapped_column(String(1024), unique=True)  # '/alice/examples'
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("folders.id", ondelete="CASCADE"), index=True)
    # Indexed (migration 0012): a user's folders are counted against ``--max-user-folders``.
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Share(Base):
    """A grant on a folder, run or artifact; ``user_id`` NULL means everyone with a key."""

    __tablename__ = "shares"
    __table_args__ = (UniqueConstraint("node_kind", "node_id", "grantee", name="uq_share"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_kind: Mapped[str] = mapped_column(String(16))  # folder, run, artifact
    node_id: Mapped[int] = mapped_column(Integer)
    grantee: Mapped[str] = mapped_column(String(64))  # a user name, or '*' for public
    level: Mapped[str] = mapped_column(String(8))  # view, edit


class Run(Base):
    __tablename__ = "runs"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True)
    id: Mapped[str] = mapped_column(ID, unique=True)
    folder_id: Mapped[int] = mapped_column(ForeignKey("folders.id", ondelete="CASCADE"), index=True)
    # Indexed (migration 0012): a user's runs are counted against ``--max-user-runs`` and summed
    # for the quota.
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(100), index=True)
    status: Mapped[str] = mapped_column(String(16))
    start_time: Mapped[str | None] = mapped_column(String(40), nullable=True)
    end_time: Mapped[str | None] = mapped_column(String(40), nullable=True)
    labels: Mapped[list[str]] = mapped_column(JSON)
    description: Mapped[str] = mapped_column(Text)
    hparams: Mapped[dict[str, Any]] = mapped_column(JSON)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON)  # the whole run.json
    platform: Mapped[dict[str, Any]] = mapped_column(JSON)  # platform.json
    uploaded: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # The stored bytes of its output (the end of its last LogPiece): the per-run limit and the
    # owner's quota read this instead of the pieces (migration 0010).
    log_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # The fields changed on the server (name, labels, description), which an upload of run.json
    # leaves alone; and when the run was moved to the trash (NULL: it is not), migration 0011.
    edited: Mapped[list[str]] = mapped_column(JSON, default=list, server_default="[]")
    deleted: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True, index=True)
    # Its stored metric points and distinct metrics (type, name), counted in the transaction that
    # inserts the points: the quota and ``--max-run-metrics`` read these, never the points
    # (migration 0012).
    metric_points: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    metric_names: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class Cursor(Base):
    """How far into one append-only file of a run or an artifact the server has stored."""

    __tablename__ = "cursors"
    __table_args__ = (UniqueConstraint("node_kind", "node_id", "stream", name="uq_cursor"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_kind: Mapped[str] = mapped_column(String(16))  # run, artifact
    node_id: Mapped[str] = mapped_column(ID)
    stream: Mapped[str] = mapped_column(String(100))  # 'metrics/train.jsonl', 'stdout.log', ...
    offset: Mapped[int] = mapped_column(BigInteger)


class MetricPoint(Base):
    """One value of one metric at one step (NaN stored as NULL).

    Keyed by (run, type, name, step), so one series is one range of the key; on SQLite the
    table is that key's B-tree (``WITHOUT ROWID``): one tree to write per point, not two.
    """

    __tablename__ = "metric_points"
    __table_args__ = (
        PrimaryKeyConstraint("run_pk", "type", "name", "step", name="pk_metric_points"),
        {"sqlite_with_rowid": False},
    )
    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.pk", ondelete="CASCADE"))
    type: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(200))
    step: Mapped[int] = mapped_column(BigInteger, autoincrement=False)
    epoch: Mapped[float | None] = mapped_column(Float, nullable=True)
    time: Mapped[float] = mapped_column(Float)
    value: Mapped[float | None] = mapped_column(Float, nullable=True)  # NULL is NaN


BLOCK = 128
"""Steps per :class:`MetricBlock` (migration 0002 fills the table with this width too)."""


class MetricBlock(Base):
    """One metric's points with steps in ``[block * BLOCK, (block + 1) * BLOCK)``, summarised.

    Written in the same transaction as the points (``ingest.store_metrics``), so a chart of a
    million points reads a few thousand of these rows instead of every point. ``count`` counts
    NaN points too; ``min_value``/``max_value`` ignore them (NULL when every point is NaN);
    ``min_at_*``/``max_at_*`` are the step, epoch and time of the first point holding each,
    where a chart draws it.
    """

    __tablename__ = "metric_blocks"
    __table_args__ = (
        PrimaryKeyConstraint("run_pk", "type", "name", "block", name="pk_metric_blocks"),
        {"sqlite_with_rowid": False},
    )
    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.pk", ondelete="CASCADE"))
    type: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(200))
    block: Mapped[int] = mapped_column(BigInteger, autoincrement=False)
    first_step: Mapped[int] = mapped_column(BigInteger)
    last_step: Mapped[int] = mapped_column(BigInteger)
    min_epoch: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_epoch: Mapped[float | None] = mapped_column(Float, nullable=True)
    min_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    count: Mapped[int] = mapped_column(BigInteger)
    min_at_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    min_at_epoch: Mapped[float | None] = mapped_column(Float, nullable=True)
    min_at_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_at_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_at_epoch: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_at_time: Mapped[float | None] = mapped_column(Float, nullable=True)


class LogPiece(Base):
    """A piece of a run's output (stdout.log): at most ``logs.PIECE_CHARS`` characters of it.

    ``start``/``end``: its place in the stored text, in UTF-8 bytes; ``line``: the number of
    newlines before it (the 0-based line it starts in), ``newlines``: the newlines in it. So
    the tail, a window of lines or a search reads a few pieces by key, whatever the log's size
    (``logs.py``; migration 0010).
    """

    __tablename__ = "log_pieces"
    __table_args__ = (
        PrimaryKeyConstraint("run_pk", "start", name="pk_log_pieces"),
        Index("ix_log_pieces_line", "run_pk", "line"),
    )
    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.pk", ondelete="CASCADE"))
    start: Mapped[int] = mapped_column(BigInteger, autoincrement=False)
    end: Mapped[int] = mapped_column(BigInteger)
    line: Mapped[int] = mapped_column(BigInteger)
    newlines: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)


class RunImage(Base):
    """One image a run logged (``run.log_image``): its PNG, once per (run, name, step)."""

    __tablename__ = "run_images"
    __table_args__ = (PrimaryKeyConstraint("run_pk", "name", "step", name="pk_run_images"),)
    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.pk", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    step: Mapped[int] = mapped_column(BigInteger, autoincrement=False)
    time: Mapped[float] = mapped_column(Float)
    width: Mapped[int] = mapped_column(Integer)
    height: Mapped[int] = mapped_column(Integer)
    size: Mapped[int] = mapped_column(Integer)
    png: Mapped[bytes] = mapped_column(LargeBinary)


class Blob(Base):
    __tablename__ = "blobs"
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class BlobUpload(Base):
    """A user who uploaded a blob's bytes: only they (and viewers of an artifact holding it) may use it.

    ``pending_until`` is set by the upload and cleared when an artifact of theirs lists the blob:
    until then the bytes are kept although no artifact refers to them (the grace period), and
    they count against the uploader's quota.
    """

    __tablename__ = "blob_uploads"
    __table_args__ = (PrimaryKeyConstraint("sha256", "user_id", name="pk_blob_uploads"),)
    sha256: Mapped[str] = mapped_column(ForeignKey("blobs.sha256", ondelete="CASCADE"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    uploaded: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    pending_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Artifact(Base):
    __tablename__ = "artifacts"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True)
    id: Mapped[str] = mapped_column(ID, unique=True)
    folder_id: Mapped[int] = mapped_column(ForeignKey("folders.id", ondelete="CASCADE"), index=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(100), index=True)
    labels: Mapped[list[str]] = mapped_column(JSON)
    description: Mapped[str] = mapped_column(Text)
    created: Mapped[str | None] = mapped_column(String(40), nullable=True)
    references: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    uploaded: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ArtifactFile(Base):
    __tablename__ = "artifact_files"
    __table_args__ = (UniqueConstraint("artifact_pk", "path", name="uq_artifact_file"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    artifact_pk: Mapped[int] = mapped_column(ForeignKey("artifacts.pk", ondelete="CASCADE"))
    path: Mapped[str] = mapped_column(String(1024))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(ForeignKey("blobs.sha256"), index=True)


class Edge(Base):
    """A lineage edge between two nodes by their kinds and ids; either end may not be uploaded (yet)."""

    __tablename__ = "lineage"
    __table_args__ = (UniqueConstraint("source_kind", "source_id", "target_kind", "target_id", name="uq_edge"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    source_kind: Mapped[str] = mapped_column(String(16))
    source_id: Mapped[str] = mapped_column(ID, index=True)
    source_name: Mapped[str] = mapped_column(String(100))
    target_kind: Mapped[str] = mapped_column(String(16))
    target_id: Mapped[str] = mapped_column(ID, index=True)
    target_name: Mapped[str] = mapped_column(String(100))
    time: Mapped[float] = mapped_column(Float)


class ConsoleSession(Base):
    """A browser's console login: the cookie holds a random token, the table its sha256 digest.

    Logging out deletes the row, so a cookie copied before logout is refused after it.
    """

    __tablename__ = "console_sessions"
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    key_id: Mapped[str] = mapped_column(String(16))  # the API key logged in with: revoking it ends the session
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


# A folder's runs newest first and its artifacts by name, read a page at a time from where the
# last page ended (``folder_paging``): index ranges, whatever the folder holds (migration 0005).
Index("ix_runs_folder_start", Run.folder_id, func.coalesce(Run.start_time, ""), Run.pk)
Index("ix_artifacts_folder_name", Artifact.folder_id, Artifact.name, Artifact.pk)
