"""Artifacts: create or update one from its artifact.json and uploaded blobs, read one back, delete.

The service behind ``/api/v1/artifacts`` (:mod:`ember.server.api.artifact_routes`): plain
functions over a session that raise :mod:`ember.server.storage.domain_errors`. A blob may be listed only
by a user who uploaded it or who can view an artifact holding it (:func:`ember.server.services.blobs.usable`);
any other digest is answered like one never uploaded (409), so digests reveal nothing.

A write locks the artifact's owner first (its folder tree's owner, who holds its bytes), then the
blob lock, then the artifact's rows: the order of :mod:`ember.server.services.perms`. Every write
to an artifact takes its owner's lock, so two never wait on each other's rows.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ember.server.services import blobs as blob_rules
from ember.server.services import edges, ingest, naming
from ember.server.services.blobs import BlobStore
from ember.server.services.lookup import claim_id, get_artifact
from ember.server.services.perms import Level, drop_shares, level, lock_owner, require, shares_of
from ember.server.services.runs import place
from ember.server.storage.domain_errors import Conflict, Invalid
from ember.server.storage.models import Artifact, ArtifactFile, Blob, Folder, User, now
from ember.server.storage.schemas import ArtifactIn
from ember.server.storage.settings import Settings


def put_artifact(
    session: Session, user: User, artifact_id: str, body: ArtifactIn, store: BlobStore, settings: Settings
) -> dict[str, Any]:
    """Create or update an artifact (by id); the file list is sent whole: it then holds exactly these files.

    Every file's blob must be uploaded first (409 naming those that are not); a size that differs
    from the uploaded blob's is a 422; blobs no artifact lists any more are collected. The blobs
    newly listed count in the owner's quota, but for those the owner's own pending uploads
    already count (413 past it, nothing kept).
    """
    meta = body.artifact
    if meta.id != naming.node_id(artifact_id, "artifact id"):
        raise Invalid(f"artifact.id {meta.id!r} differs from the id in the URL {artifact_id!r}")
    naming.display_name(meta.name, "artifact.name")
    files: dict[str, Any] = {}
    for f in meta.files:
        files[naming.rel_path(f.path, "artifact file path")] = f
        naming.sha256(f.sha256)
    for r in meta.references:
        naming.rel_path(r.path, "artifact reference path")
    freed: set[str] = set()
    artifact = session.scalar(select(Artifact).where(Artifact.id == artifact_id))
    if artifact is not None:
        require(level(session, user, artifact), Level.EDIT, f"artifact {artifact_id}")
        blob_rules.hold(session, artifact.owner_id, settings.quota_bytes)
        action = "updated"
    else:
        claim_id(session, "artifact", artifact_id)
        folder, action, freed = place(session, user, body, Artifact, meta.name, "artifact", settings.max_user_folders)
        if action == "skipped":
            return {"id": artifact_id, "action": action, "folder": folder.path, "cursors": {}}
        artifact = Artifact(id=artifact_id, folder_id=folder.id, owner_id=folder.owner_id)
        blob_rules.hold(session, folder.owner_id, settings.quota_bytes)  # ensure_folder locked it: no wait here
    wanted = sorted({f.sha256 for f in files.values()})
    blob_rules.lock(session)  # no blob listed here is collected meanwhile
    usable = blob_rules.usable(session, user, wanted)
    have = {s: n for s, n in session.execute(select(Blob.sha256, Blob.size).where(Blob.sha256.in_(usable)))}
    lacking = [s for s in wanted if s not in have]
    if lacking:
        raise Conflict(f"upload these blobs first (PUT /api/v1/blobs/<sha256>): {', '.join(lacking[:20])}")
    wrong = [p for p, f in files.items() if have[f.sha256] != f.size]
    if wrong:
        raise Invalid(f"size differs from the uploaded blob's for: {', '.join(wrong[:20])}")
    session.add(artifact)
    artifact.name, artifact.labels, artifact.description = meta.name, list(meta.labels), meta.description
    artifact.created, artifact.uploaded = meta.created, now()
    artifact.references = [r.model_dump() for r in meta.references]
    session.flush()
    old = {f.path: f for f in session.scalars(select(ArtifactFile).where(ArtifactFile.artifact_pk == artifact.pk))}
    added = blob_rules.newly_held(session, artifact.owner_id, set(wanted) - {f.sha256 for f in old.values()}, have)
    for path, row in old.items():
        if path not in files or row.sha256 != files[path].sha256:
            freed.add(row.sha256)
        if path not in files:
            session.delete(row)
    for path, f in files.items():
        kept = old.get(path)
        if kept is None:
            session.add(ArtifactFile(artifact_pk=artifact.pk, path=path, size=f.size, sha256=f.sha256))
        else:
            kept.size, kept.sha256 = f.size, f.sha256
    session.flush()
    blob_rules.claim(session, user, wanted)
    blob_rules.charge(session, artifact.owner_id, added, settings.quota_bytes)
    blob_rules.collect(session, store, freed)
    folder_path = session.scalar(select(Folder.path).where(Folder.id == artifact.folder_id))
    cursors = ingest.cursors(session, "artifact", artifact_id)
    return {"id": artifact_id, "action": action, "folder": folder_path, "cursors": cursors}


def artifact_view(session: Session, user: User, artifact: Artifact, depth: int | None = 1) -> dict[str, Any]:
    """An artifact the caller may view: metadata, files with sha256 and size, references, lineage
    ``depth`` levels each way (as :func:`ember.server.services.runs.run_view` gives it)."""
    lineage = edges.edges_of(session, "artifact", artifact.id, artifact.name, user, depth)
    files = session.scalars(
        select(ArtifactFile).where(ArtifactFile.artifact_pk == artifact.pk).order_by(ArtifactFile.path)
    ).all()
    return {
        "id": artifact.id,
        "name": artifact.name,
        "folder": session.scalar(select(Folder.path).where(Folder.id == artifact.folder_id)),
        "labels": artifact.labels,
        "description": artifact.description,
        "created": artifact.created,
        "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in files],
        "references": artifact.references,
        **edges.lineage_fields(lineage),
        "cursors": ingest.cursors(session, "artifact", artifact.id),
        "shares": shares_of(session, "artifact", artifact.pk),
    }


def delete_artifact(session: Session, user: User, artifact_id: str, store: BlobStore) -> dict[str, Any]:
    """Delete an artifact the caller may edit, and the blobs no other artifact lists (its owner's
    row, then the blob lock, then its rows: it frees bytes, so no bound changes)."""
    artifact = get_artifact(session, user, artifact_id, Level.EDIT)
    lock_owner(session, artifact.owner_id)
    blob_rules.lock(session)
    held = set(session.scalars(select(ArtifactFile.sha256).where(ArtifactFile.artifact_pk == artifact.pk)))
    ingest.drop_cursors(session, "artifact", artifact.id)
    drop_shares(session, "artifact", artifact.pk)
    session.delete(artifact)
    session.flush()
    blob_rules.collect(session, store, held)
    return {"id": artifact_id, "deleted": True}
