"""``/api/v1/blobs`` and ``/api/v1/artifacts``: content-addressed files and the artifacts listing them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from ember.server import blobs as blob_rules
from ember.server import ingest, naming
from ember.server.auth import BriefUser, CurrentUser, DbSession, now
from ember.server.blobs import BlobStore
from ember.server.models import Artifact, ArtifactFile, Blob, Cursor, Folder, User
from ember.server.perms import Level, drop_shares, level, require, shares_of
from ember.server.routes_runs import place
from ember.server.schemas import ArtifactIn, BlobQuery, LineageBatch
from ember.server.settings import Settings
from ember.server.wire import CheckedRoute, content_disposition

blobs = APIRouter(prefix="/blobs", tags=["artifacts"], route_class=CheckedRoute)
router = APIRouter(prefix="/artifacts", tags=["artifacts"], route_class=CheckedRoute)


def _store(request: Request) -> BlobStore:
    return request.app.state.blobs


@blobs.post("/missing", summary="Which of these blobs you have not uploaded yet (send only those)")
def missing_blobs(query: BlobQuery, request: Request, user: CurrentUser, session: DbSession):
    """Answers from the caller's own uploads: whether anyone else holds the bytes is not told."""
    wanted = sorted({naming.sha256(s) for s in query.sha256})
    have = blob_rules.own(session, user, wanted)
    store = _store(request)
    return {"missing": [s for s in wanted if s not in have or not store.has(s)]}


@blobs.put("/{sha256}", summary="Upload one file's bytes; stored only when they hash to the URL's sha256")
async def put_blob(sha256: str, request: Request, user: BriefUser):
    """Streams the bytes to a temporary file (in worker threads), then records them in a worker thread.

    Nothing here touches the database or a file on the event loop: on SQLite a transaction
    waiting there for the write lock would stop every other request of the process.
    """
    sha = naming.sha256(sha256)
    settings: Settings = request.app.state.settings
    limit = settings.max_blob_bytes
    limit_text = f"the file passes the server's limit of {limit} bytes"
    if settings.quota_bytes is not None:
        left = settings.quota_bytes - await run_in_threadpool(_usage, request, user)
        if left < limit:
            limit, limit_text = max(0, left), _quota_text(user, settings.quota_bytes)
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise HTTPException(413, limit_text)
    store = _store(request)
    tmp = await store.receive(sha, request.stream(), limit, limit_text)
    try:
        size = await run_in_threadpool(_record, request, user, sha, tmp)
    finally:
        await run_in_threadpool(tmp.unlink, True)
    return {"sha256": sha, "size": size}


def _quota_text(user: User, quota: int) -> str:
    return (
        f"the file passes what is left of {user.name!r}'s storage quota of {quota} bytes: delete artifacts, "
        "or ask an admin to raise `ember server --quota-mb`"
    )


def _usage(request: Request, user: User) -> int:
    with request.app.state.read_sessions() as session, session.begin():
        return blob_rules.usage(session, user.id)


def _record(request: Request, user: User, sha: str, tmp: Path) -> int:
    """Record a received blob as the user's upload and move its file into place, in one transaction."""
    settings: Settings = request.app.state.settings
    size = tmp.stat().st_size
    with request.app.state.sessions() as session, session.begin():
        blob_rules.lock(session)
        blob_rules.record_upload(session, user, sha, size, settings.blob_grace_s)
        blob_rules.check_quota(session, user.id, user.name, settings.quota_bytes)
        _store(request).place(tmp, sha)
    return size


def get_artifact(session: Session, user: User, artifact_id: str, needed: Level = Level.VIEW) -> Artifact:
    """The artifact with this id if the caller has ``needed`` on it (404/403 otherwise)."""
    artifact = session.scalar(select(Artifact).where(Artifact.id == naming.node_id(artifact_id, "artifact id")))
    if artifact is None:
        raise HTTPException(404, f"artifact {artifact_id} does not exist or is not shared with you")
    require(level(session, user, artifact), needed, f"artifact {artifact_id}")
    return artifact


@router.put("/{artifact_id}", summary="Create or update an artifact; every file's blob must be uploaded first")
def put_artifact(artifact_id: str, body: ArtifactIn, request: Request, user: CurrentUser, session: DbSession):
    """The file list is sent whole: the artifact then holds exactly these files.

    A blob may be listed only by a user who uploaded it or who can view an artifact holding it;
    any other digest is answered like one never uploaded (409), so digests reveal nothing.
    """
    meta = body.artifact
    if meta.id != naming.node_id(artifact_id, "artifact id"):
        raise HTTPException(422, f"artifact.id {meta.id!r} differs from the id in the URL {artifact_id!r}")
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
        action = "updated"
    else:
        folder, action, freed = place(session, user, body, Artifact, meta.name, "artifact")
        if action == "skipped":
            return {"id": artifact_id, "action": action, "folder": folder.path, "cursors": {}}
        artifact = Artifact(id=artifact_id, folder_id=folder.id, owner_id=folder.owner_id)
    wanted = sorted({f.sha256 for f in files.values()})
    blob_rules.lock(session)  # no blob listed here is collected meanwhile
    usable = blob_rules.usable(session, user, wanted)
    have = {s: n for s, n in session.execute(select(Blob.sha256, Blob.size).where(Blob.sha256.in_(usable)))}
    lacking = [s for s in wanted if s not in have]
    if lacking:
        raise HTTPException(409, f"upload these blobs first (PUT /api/v1/blobs/<sha256>): {', '.join(lacking[:20])}")
    wrong = [p for p, f in files.items() if have[f.sha256] != f.size]
    if wrong:
        raise HTTPException(422, f"size differs from the uploaded blob's for: {', '.join(wrong[:20])}")
    session.add(artifact)
    artifact.name, artifact.labels, artifact.description = meta.name, list(meta.labels), meta.description
    artifact.created, artifact.uploaded = meta.created, now()
    artifact.references = [r.model_dump() for r in meta.references]
    session.flush()
    old = {f.path: f for f in session.scalars(select(ArtifactFile).where(ArtifactFile.artifact_pk == artifact.pk))}
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
    settings: Settings = request.app.state.settings
    blob_rules.claim(session, user, wanted)
    owner = session.scalar(select(User.name).where(User.id == artifact.owner_id)) or "?"
    blob_rules.check_quota(session, artifact.owner_id, owner, settings.quota_bytes)
    blob_rules.collect(session, _store(request), freed)
    folder_path = session.scalar(select(Folder.path).where(Folder.id == artifact.folder_id))
    return {"id": artifact_id, "action": action, "folder": folder_path, "cursors": ingest.cursors(session, artifact_id)}


@router.get("/{artifact_id}", summary="An artifact: metadata, files with sha256 and size, references, lineage")
def read_artifact(artifact_id: str, user: CurrentUser, session: DbSession):
    artifact = get_artifact(session, user, artifact_id)
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
        "lineage": ingest.edges_of(session, artifact.id, user),
        "cursors": ingest.cursors(session, artifact.id),
        "shares": shares_of(session, "artifact", artifact.pk),
    }


@router.get("/{artifact_id}/files/{path:path}", summary="Download one file of an artifact")
def download(
    artifact_id: str,
    path: str,
    request: Request,
    user: CurrentUser,
    session: DbSession,
):
    return file_response(_store(request), get_artifact_file(session, user, artifact_id, path))


def get_artifact_file(session: Session, user: User, artifact_id: str, path: str) -> ArtifactFile:
    """The file ``path`` of an artifact the caller may view (404 for a missing artifact or file)."""
    artifact = get_artifact(session, user, artifact_id)
    row = session.scalar(
        select(ArtifactFile).where(
            ArtifactFile.artifact_pk == artifact.pk, ArtifactFile.path == naming.rel_path(path, "file path")
        )
    )
    if row is None:
        raise HTTPException(404, f"artifact {artifact_id} has no file {path!r}")
    return row


def file_response(store: BlobStore, row: ArtifactFile) -> FileResponse:
    """An artifact file's bytes as an attachment (streamed from disk); 410 when they are gone."""
    blob = store.path(row.sha256)
    if not blob.is_file():
        raise HTTPException(410, f"the stored bytes of {row.path!r} are missing from the server's data folder")
    disposition = content_disposition(row.path.rsplit("/", 1)[-1])
    return FileResponse(blob, media_type="application/octet-stream", headers={"Content-Disposition": disposition})


@router.post("/{artifact_id}/lineage", summary="Append complete lines of the artifact's lineage.jsonl")
def post_lineage(artifact_id: str, batch: LineageBatch, user: CurrentUser, session: DbSession):
    artifact = get_artifact(session, user, artifact_id, Level.EDIT)
    return {"cursor": ingest.store_edges(session, artifact.id, batch.edges, batch.start, batch.end)}


@router.delete("/{artifact_id}", summary="Delete an artifact, and the blobs no other artifact lists")
def delete_artifact(artifact_id: str, request: Request, user: CurrentUser, session: DbSession):
    artifact = get_artifact(session, user, artifact_id, Level.EDIT)
    held = set(session.scalars(select(ArtifactFile.sha256).where(ArtifactFile.artifact_pk == artifact.pk)))
    session.execute(delete(Cursor).where(Cursor.node_id == artifact.id))
    drop_shares(session, "artifact", artifact.pk)
    session.delete(artifact)
    session.flush()
    blob_rules.collect(session, _store(request), held)
    return {"id": artifact_id, "deleted": True}
