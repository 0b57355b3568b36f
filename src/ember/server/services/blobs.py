"""Content-addressed file storage under ``<data>/blobs/<aa>/<bb>/<sha256>``, and who may use a blob.

An upload streams into ``<data>/tmp/`` while being hashed (the writing and hashing run in worker
threads, never on the event loop), and is renamed into place only when its digest equals the one
in the URL; a cut-off upload leaves at most a temporary file, which the next start-up removes.
The only path ever built from client input is from a digest that
:func:`ember.server.services.naming.sha256` has checked to be 64 hex digits.

Blobs are private. Knowing a digest proves nothing, so a blob may be listed in an artifact only
by a user who uploaded those bytes (``blob_uploads``) or who can already view an artifact holding
them; ``POST /blobs/missing`` answers from the caller's own uploads. A blob no artifact lists is
removed when its last artifact is deleted, or, when it was never listed, once its upload's grace
period has passed (:func:`collect`). A user's storage (:func:`usage`) is the blobs listed by
artifacts in their folder tree, plus their uploads still waiting for an artifact, plus the
images, the stored output (``runs.log_bytes``) and the metric points (``runs.metric_points``, each
:data:`POINT_BYTES`) of the runs in their tree.

The quota's check does not sum that on every request: each user's row keeps a bound,
``users.stored_bytes``, never below their usage. A write that adds bytes to an owner's storage
(metric points, output, images, a blob upload, an artifact listing blobs) first locks the owner
(:func:`hold`, step 1 of the lock order in :mod:`ember.server.services.perms`), and once the
bytes are in, :func:`charge` adds what it stored (at least what the usage grew by) to the bound:
within the quota, the request passes and the bound is raised; past it, the usage is summed
exactly and the request refused only when that is past the quota too (the sum becomes the bound).
What frees bytes (a run or artifact deleted or purged, a blob collected, an upload's grace
period over, an upload listed by someone else's artifact) leaves the bound alone: it only gets
looser, and the next check it would refuse sums again. Owners never change (a run or artifact
stays in the tree it was made in), so no bytes move between users. A write without a quota
(``ember ui``'s own store, a server without ``--quota-mb``) forgets the bound (NULL) instead, so a
quota set later starts from an exact sum.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import AsyncIterator, Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO

import anyio.to_thread
from sqlalchemy import delete, exists, func, select, text, union, update
from sqlalchemy.orm import Session, sessionmaker

from ember._atomic import atomic_path, fsync_dir
from ember.server.services import naming
from ember.server.services.ingest import insert_ignore
from ember.server.services.perms import Level, level, lock_owner
from ember.server.storage.domain_errors import Invalid, TooLarge
from ember.server.storage.models import Artifact, ArtifactFile, Blob, BlobUpload, Run, RunImage, User, now
from ember.server.storage.settings import Settings

_FLUSH_BYTES = 1 << 20  # bytes gathered before one write+hash step in a worker thread
POINT_BYTES = 128
"""What one stored metric point counts in its owner's quota (8,192 points a MiB): about what a point
takes on PostgreSQL with its share of the block summaries and indexes (134.8 bytes measured;
39.6 on SQLite), by ``benchmarks/server_point_bytes.py``."""


class BlobStore:
    """The blob folder of one server.

    Example:
        >>> store = BlobStore(Path("/srv/ember"))
        >>> store.path("ab" * 32)
        PosixPath('/srv/ember/blobs/ab/ab/abab...')
    """

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "blobs"
        self.tmp = data_dir / "tmp"
        self.root.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)

    def path(self, sha: str) -> Path:
        """Where the blob with this digest lives (the digest is checked first)."""
        sha = naming.sha256(sha)
        return self.root / sha[:2] / sha[2:4] / sha

    def has(self, sha: str) -> bool:
        """Whether the blob's file is present."""
        return self.path(sha).is_file()

    def clean_tmp(self) -> None:
        """Remove temporary files left by uploads that were cut off."""
        for leftover in self.tmp.glob("*.part"):
            leftover.unlink(missing_ok=True)

    async def receive(self, sha: str, chunks: AsyncIterator[bytes], max_bytes: int, limit_text: str) -> Path:
        """Stream an upload into a temporary file, checking its size and digest; return the file.

        The caller moves it into place with :meth:`place` (in the transaction that records the
        blob) or removes it. Writing and hashing run in worker threads.

        Raises:
            TooLarge: 413 (``limit_text``) when it passes ``max_bytes``.
            Invalid: 422 when its digest differs.
        """
        incoming = await anyio.to_thread.run_sync(_Incoming, self, sha, max_bytes, limit_text)
        buffer = bytearray()
        try:
            async for chunk in chunks:
                incoming.count(len(chunk))
                buffer += chunk
                if len(buffer) >= _FLUSH_BYTES:
                    await anyio.to_thread.run_sync(incoming.write, bytes(buffer))
                    buffer.clear()
            await anyio.to_thread.run_sync(incoming.write, bytes(buffer))
            return await anyio.to_thread.run_sync(incoming.finish)
        except BaseException:
            await anyio.to_thread.run_sync(incoming.discard)
            raise

    def take(self, sha: str, file: IO[bytes], max_bytes: int, limit_text: str) -> Path:
        """:meth:`receive` from a file read in this thread (an upload in process)."""
        incoming = _Incoming(self, sha, max_bytes, limit_text)
        try:
            while chunk := file.read(_FLUSH_BYTES):
                incoming.count(len(chunk))
                incoming.write(chunk)
            return incoming.finish()
        except BaseException:
            incoming.discard()
            raise

    def place(self, tmp: Path, sha: str) -> None:
        """Move a received file into place durably (the same bytes may already be there).

        Through :func:`ember._atomic.atomic_path`: the file is fsynced, renamed over the blob's
        name and its folder fsynced, so a blob survives a power loss once its upload is recorded
        (a fan-out folder made here is fsynced into its parent too).
        """
        final = self.path(sha)
        for folder in (final.parent.parent, final.parent):
            if not folder.is_dir():
                folder.mkdir(parents=True, exist_ok=True)
                fsync_dir(folder.parent)
        with atomic_path(final) as staged:
            os.replace(tmp, staged)

    def remove(self, sha: str) -> None:
        """Delete a blob's file (nothing when it is already gone)."""
        self.path(sha).unlink(missing_ok=True)


class _Incoming:
    """A blob arriving: its bytes hashed and written to a temporary file, their count bounded."""

    def __init__(self, store: BlobStore, sha: str, max_bytes: int, limit_text: str) -> None:
        self.sha, self.max_bytes, self.limit_text = sha, max_bytes, limit_text
        self.tmp = store.tmp / f"{secrets.token_hex(16)}.part"
        self.hasher = hashlib.sha256()
        self.size = 0
        self.out = open(self.tmp, "wb")  # noqa: SIM115 - closed by finish or discard

    def count(self, size: int) -> None:
        """Add ``size`` bytes to what arrived: :class:`TooLarge` past the limit."""
        self.size += size
        if self.size > self.max_bytes:
            raise TooLarge(self.limit_text)

    def write(self, data: bytes) -> None:
        self.hasher.update(data)
        self.out.write(data)

    def finish(self) -> Path:
        """The complete file, once its digest is the one announced (:class:`Invalid` otherwise)."""
        self.out.close()
        if self.hasher.hexdigest() != self.sha:
            raise Invalid(
                f"the bytes sent hash to {self.hasher.hexdigest()}, not to {self.sha}: the upload was damaged"
            )
        return self.tmp

    def discard(self) -> None:
        self.out.close()
        self.tmp.unlink(missing_ok=True)


def lock(session: Session) -> None:
    """Serialise blob bookkeeping (upload, listing, collection) with other processes until commit.

    On SQLite every transaction already holds the database's write lock; on PostgreSQL a
    transaction-scoped advisory lock does it, so a blob being collected cannot be re-uploaded
    (its file replaced) between the collector's check and its unlink. Step 2 of the lock order
    (:mod:`ember.server.services.perms`): after the owner's row, before any node's rows.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(7316871)"))


def own(session: Session, user: User, shas: Iterable[str]) -> set[str]:
    """Those of ``shas`` the user uploaded."""
    wanted = list(shas)
    if not wanted:
        return set()
    rows = session.scalars(
        select(BlobUpload.sha256).where(BlobUpload.user_id == user.id, BlobUpload.sha256.in_(wanted))
    )
    return set(rows)


def usable(session: Session, user: User, shas: Iterable[str]) -> set[str]:
    """Those of ``shas`` the user may list in an artifact: uploaded by them, or in an artifact they can view."""
    wanted = set(shas)
    allowed = own(session, user, wanted)
    rest = wanted - allowed
    if rest:
        holders = session.execute(
            select(ArtifactFile.sha256, Artifact)
            .join(Artifact, Artifact.pk == ArtifactFile.artifact_pk)
            .where(ArtifactFile.sha256.in_(rest))
        ).all()
        seen: dict[int, bool] = {}
        for sha, artifact in holders:
            if sha in allowed:
                continue
            if artifact.pk not in seen:
                seen[artifact.pk] = level(session, user, artifact) >= Level.VIEW
            if seen[artifact.pk]:
                allowed.add(sha)
    return allowed


def record_upload(session: Session, user: User, sha: str, size: int, grace_s: float) -> None:
    """Record a received blob and its uploader (pending for ``grace_s``) in the session's transaction."""
    stamp = now()
    insert_ignore(session, Blob, [{"sha256": sha, "size": size, "created": stamp}], ["sha256"])
    row = session.get(BlobUpload, (sha, user.id))
    until = stamp + timedelta(seconds=grace_s)
    if row is None:
        session.add(BlobUpload(sha256=sha, user_id=user.id, uploaded=stamp, pending_until=until))
    else:
        row.uploaded = stamp
        if row.pending_until is not None:
            row.pending_until = until
    session.flush()


def record(
    sessions: sessionmaker[Session], store: BlobStore, settings: Settings, user: User, sha: str, tmp: Path
) -> int:
    """:func:`record_in` in a transaction of its own (a streamed upload holds none while its bytes arrive)."""
    with sessions() as session, session.begin():
        return record_in(session, store, settings, user, sha, tmp)


def record_in(session: Session, store: BlobStore, settings: Settings, user: User, sha: str, tmp: Path) -> int:
    """Record a received blob as the user's upload and move its file into place, in the session's
    transaction; its size.

    Raises:
        TooLarge: 413 when the upload takes the user past the quota (nothing is recorded).
    """
    size = tmp.stat().st_size
    hold(session, user.id, settings.quota_bytes)
    lock(session)
    record_upload(session, user, sha, size, settings.blob_grace_s)
    charge(session, user.id, size, settings.quota_bytes)
    store.place(tmp, sha)
    return size


def upload_limit(settings: Settings, user: User, used: int | None) -> tuple[int, str]:
    """The most bytes the user's next blob may hold, and the sentence refusing more: the server's
    limit per blob, or what is left of the quota (``used``: the user's usage; None without a quota)."""
    limit, text = settings.max_blob_bytes, f"the file passes the server's limit of {settings.max_blob_bytes} bytes"
    if settings.quota_bytes is not None and used is not None:
        left = settings.quota_bytes - used
        if left < limit:
            limit, text = max(0, left), quota_text(user, settings.quota_bytes)
    return limit, text


def claim(session: Session, user: User, shas: Iterable[str]) -> None:
    """The user's uploads of ``shas`` are now listed by an artifact: no longer pending."""
    wanted = list(shas)
    if wanted:
        session.execute(
            update(BlobUpload)
            .where(BlobUpload.user_id == user.id, BlobUpload.sha256.in_(wanted))
            .values(pending_until=None)
        )


def newly_held(session: Session, owner_id: int, shas: set[str], sizes: dict[str, int]) -> int:
    """At least what listing ``shas`` (not yet in the artifact) in an artifact of the owner adds to
    their :func:`usage`: their sizes (``sizes``), but for the owner's uploads still pending, which
    count already (a blob the owner lists elsewhere too is counted again: the bound only loosens)."""
    if not shas:
        return 0
    pending = set(
        session.scalars(
            select(BlobUpload.sha256).where(
                BlobUpload.user_id == owner_id, BlobUpload.sha256.in_(sorted(shas)), BlobUpload.pending_until > now()
            )
        )
    )
    return sum(sizes[sha] for sha in shas - pending)


def usage(session: Session, user_id: int, at: datetime | None = None) -> int:
    """Bytes held by a user: blobs listed by artifacts they own, their uploads still pending (each
    blob once), and the images, stored output and metric points (:data:`POINT_BYTES` each) of the
    runs they own."""
    at = at or now()
    listed = (
        select(ArtifactFile.sha256.label("sha256"))
        .join(Artifact, Artifact.pk == ArtifactFile.artifact_pk)
        .where(Artifact.owner_id == user_id)
    )
    pending = select(BlobUpload.sha256.label("sha256")).where(
        BlobUpload.user_id == user_id, BlobUpload.pending_until > at
    )
    held = union(listed, pending).subquery()
    total = session.scalar(select(func.coalesce(func.sum(Blob.size), 0)).where(Blob.sha256.in_(select(held.c.sha256))))
    pictures = session.scalar(
        select(func.coalesce(func.sum(RunImage.size), 0))
        .join(Run, Run.pk == RunImage.run_pk)
        .where(Run.owner_id == user_id)
    )
    output, points = session.execute(
        select(func.coalesce(func.sum(Run.log_bytes), 0), func.coalesce(func.sum(Run.metric_points), 0)).where(
            Run.owner_id == user_id
        )
    ).one()
    return int(total or 0) + int(pictures or 0) + int(output or 0) + int(points or 0) * POINT_BYTES


def upload_usage(session: Session, user_id: int, settings: Settings) -> int | None:
    """The usage :func:`upload_limit` bounds the user's next blob with: None without a quota; the
    user's bound (``users.stored_bytes``) when it leaves room for the largest blob the server takes
    anyway, else the exact :func:`usage` (the limit is then what is left of the quota)."""
    if settings.quota_bytes is None:
        return None
    bound = session.scalar(select(User.stored_bytes).where(User.id == user_id))
    if bound is not None and settings.quota_bytes - bound >= settings.max_blob_bytes:
        return int(bound)
    return usage(session, user_id)


def usage_now(sessions: sessionmaker[Session], user: User, settings: Settings) -> int | None:
    """:func:`upload_usage` in a read-only transaction of its own (a streaming upload holds no session)."""
    with sessions() as session, session.begin():
        return upload_usage(session, user.id, settings)


def quota_text(user: User, quota: int) -> str:
    """Why an upload that would take ``user`` past the quota is refused."""
    return (
        f"the file passes what is left of {user.name!r}'s storage quota of {quota} bytes: delete artifacts "
        "or runs with images or long output, or ask an admin to raise `ember server --quota-mb`"
    )


def hold(session: Session, owner_id: int, quota: int | None) -> None:
    """Start a write that adds bytes to the owner's storage: lock the owner's row
    (:func:`~ember.server.services.perms.lock_owner`), before any other lock but a new node's id,
    so that :func:`charge` sees what the writes before it left. Without a quota, forget the
    owner's bound instead (it would miss these bytes); once it is NULL that locks nothing."""
    if quota is not None:
        lock_owner(session, owner_id)
    else:
        session.execute(_FORGET, {"id": owner_id})


_FORGET = text("UPDATE users SET stored_bytes = NULL WHERE id = :id AND stored_bytes IS NOT NULL")
_RAISE = text(
    "UPDATE users SET stored_bytes = stored_bytes + :added WHERE id = :id AND stored_bytes + :added <= :quota"
)


def charge(session: Session, owner_id: int, added: int, quota: int | None) -> None:
    """413 when the bytes this transaction added take the owner past ``quota`` (None: no quota).

    ``added``: at least what the owner's :func:`usage` grew by in this transaction (more only
    loosens the bound). The caller took :func:`hold` first. One statement raises the owner's bound
    when the sum stays within the quota; otherwise (or with no bound yet) the usage is summed
    exactly, after what the request added is flushed, and kept as the bound when it fits.
    """
    if quota is None:
        return
    if session.connection().execute(_RAISE, {"added": added, "id": owner_id, "quota": quota}).rowcount == 1:
        return
    session.flush()
    used = usage(session, owner_id)
    if used > quota:
        name = session.scalar(select(User.name).where(User.id == owner_id)) or "?"
        raise TooLarge(
            f"this would make {used} bytes of artifact files, run images, metric points ({POINT_BYTES} bytes each) "
            f"and run output held by {name!r}, over the quota of {quota} bytes per user: delete artifacts or runs "
            "with images, many points or long output, or ask an admin "
            "to raise `ember server --quota-mb`",
        )
    session.execute(update(User).where(User.id == owner_id).values(stored_bytes=used))


def charge_points(session: Session, owner_id: int, quota: int | None, points: int) -> None:
    """:func:`charge` of ``points`` new metric points (:data:`POINT_BYTES` each)."""
    charge(session, owner_id, points * POINT_BYTES, quota)


def collect(session: Session, store: BlobStore, shas: Iterable[str] | None = None, at: datetime | None = None) -> int:
    """Remove blobs no artifact lists and no pending upload keeps; return how many went.

    Args:
        shas: only these (the blobs of an artifact just deleted or changed); None: every blob.
        at: the time pending uploads are compared with (now).

    The files are unlinked inside the transaction, under :func:`lock`, so that an upload of the
    same bytes waits and then stores them anew. It frees bytes, so no bound changes.
    """
    at = at or now()
    lock(session)
    listed = exists().where(ArtifactFile.sha256 == Blob.sha256)
    waiting = exists().where(BlobUpload.sha256 == Blob.sha256, BlobUpload.pending_until > at)
    query = select(Blob.sha256).where(~listed, ~waiting)
    if shas is not None:
        wanted = sorted(set(shas))
        if not wanted:
            return 0
        query = query.where(Blob.sha256.in_(wanted))
    gone = list(session.scalars(query))
    for i in range(0, len(gone), 500):
        part = gone[i : i + 500]
        session.execute(delete(BlobUpload).where(BlobUpload.sha256.in_(part)))
        session.execute(delete(Blob).where(Blob.sha256.in_(part)))
    session.flush()
    for sha in gone:
        store.remove(sha)
    return len(gone)
