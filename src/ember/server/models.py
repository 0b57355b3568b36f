"""The tables: users, API keys, folders, shares, runs, metric points, logs, artifacts, blobs, lineage.

The schema is created and changed only by the Alembic migrations in ``migrations/versions``;
these classes must match them (a test compares the two).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

ID = String(32)  # uuid4 hex, as the local store writes it


class Base(DeclarativeBase):
    """Declarative base of every table."""


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True))


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


class Folder(Base):
    __tablename__ = "folders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    path: Mapped[str] = mapped_column(String(1024), unique=True)  # '/alice/examples'
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("folders.id", ondelete="CASCADE"), index=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
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
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
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


class Cursor(Base):
    """How far into one append-only file of a run (or artifact) the server has stored."""

    __tablename__ = "cursors"
    __table_args__ = (UniqueConstraint("node_id", "stream", name="uq_cursor"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[str] = mapped_column(ID)
    stream: Mapped[str] = mapped_column(String(100))  # 'metrics/train.jsonl', 'stdout.log', ...
    offset: Mapped[int] = mapped_column(BigInteger)


class MetricPoint(Base):
    __tablename__ = "metric_points"
    __table_args__ = (UniqueConstraint("run_pk", "type", "step", "name", name="uq_point"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.pk", ondelete="CASCADE"))
    type: Mapped[str] = mapped_column(String(64))
    step: Mapped[int] = mapped_column(BigInteger)
    name: Mapped[str] = mapped_column(String(200))
    epoch: Mapped[float | None] = mapped_column(Float, nullable=True)
    time: Mapped[float] = mapped_column(Float)
    value: Mapped[float | None] = mapped_column(Float, nullable=True)  # NULL is NaN


class LogChunk(Base):
    """A piece of a run's stdout.log, keyed by its byte offset in the file."""

    __tablename__ = "log_chunks"
    __table_args__ = (UniqueConstraint("run_pk", "start", name="uq_log_chunk"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.pk", ondelete="CASCADE"))
    start: Mapped[int] = mapped_column(BigInteger)
    end: Mapped[int] = mapped_column(BigInteger)
    text: Mapped[str] = mapped_column(Text)


class Blob(Base):
    __tablename__ = "blobs"
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True))


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
    sha256: Mapped[str] = mapped_column(ForeignKey("blobs.sha256"))


class Edge(Base):
    """A lineage edge between two nodes by their ids; either end may not be uploaded (yet)."""

    __tablename__ = "lineage"
    __table_args__ = (UniqueConstraint("source_id", "target_id", name="uq_edge"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    source_kind: Mapped[str] = mapped_column(String(16))
    source_id: Mapped[str] = mapped_column(ID, index=True)
    source_name: Mapped[str] = mapped_column(String(100))
    target_kind: Mapped[str] = mapped_column(String(16))
    target_id: Mapped[str] = mapped_column(ID, index=True)
    target_name: Mapped[str] = mapped_column(String(100))
    time: Mapped[float] = mapped_column(Float)
