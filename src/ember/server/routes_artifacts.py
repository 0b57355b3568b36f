"""``/api/v1/blobs`` and ``/api/v1/artifacts``: content-addressed files and the artifacts listing them."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from ember.server import ingest, naming
from ember.server.auth import BriefUser, CurrentUser, DbSession, now
from ember.server.blobs import BlobStore
from ember.server.models import Artifact, ArtifactFile, Blob, Cursor, Folder, User
from ember.server.perms import Level, drop_shares, level, require, shares_of
from ember.server.routes_runs import place
from ember.server.schemas import ArtifactIn, BlobQuery, LineageBatch

blobs = APIRouter(prefix="/blobs", tags=["artifacts"])
router = APIRouter(prefix="/artifacts", tags=["artifacts"])


def _store(request: Request) -> BlobStore:
    return request.app.state.blobs


@blobs.post("/missing", summary="Which of these blobs the server lacks (send only those)")
def missing_blobs(query: BlobQuery, request: Request, user: CurrentUser, session: DbSession):
    wanted = sorted({naming.sha256(s) for s in query.sha256})
    have = set(session.scalars(select(Blob.sha256).where(Blob.sha256.in_(wanted))).all()) if wanted else set()
    store = _store(request)
    return {"missing": [s for s in wanted if s not in have or not store.has(s)]}


@blobs.put("/{sha256}", summary="Upload one file's bytes; stored only when they hash to the URL's sha256")
async def put_blob(sha256: str, request: Request, user: BriefUser):
    store = _store(request)
    limit = request.app.state.settings.max_blob_bytes
    size = await store.receive(naming.sha256(sha256), request.stream(), limit)
    factory = request.app.state.sessions
    with factory() as session, session.begin():
        ingest.insert_ignore(session, Blob, [{"sha256": sha256, "size": size, "created": now()}], ["sha256"])
    return {"sha256": sha256, "size": size}


def get_artifact(session: Session, user: User, artifact_id: str, needed: Level = Level.VIEW) -> Artifact:
    """The artifact with this id if the caller has ``needed`` on it (404/403 otherwise)."""
    artifact = session.scalar(select(Artifact).where(Artifact.id == naming.node_id(artifact_id, "artifact id")))
    if artifact is None:
        raise HTTPException(404, f"artifact {artifact_id} does not exist or is not shared with you")
    require(level(session, user, artifact), needed, f"artifact {artifact_id}")
    return artifact


@router.put("/{artifact_id}", summary="Create or update an artifact; every file's blob must be uploaded first")
def put_artifact(artifact_id: str, body: ArtifactIn, user: CurrentUser, session: DbSession):
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
    wanted = sorted({f.sha256 for f in files.values()})
    have = {s: n for s, n in session.execute(select(Blob.sha256, Blob.size).where(Blob.sha256.in_(wanted)))}
    lacking = [s for s in wanted if s not in have]
    if lacking:
        raise HTTPException(409, f"upload these blobs first (PUT /api/v1/blobs/<sha256>): {', '.join(lacking[:20])}")
    wrong = [p for p, f in files.items() if have[f.sha256] != f.size]
    if wrong:
        raise HTTPException(422, f"size differs from the uploaded blob's for: {', '.join(wrong[:20])}")
    artifact = session.scalar(select(Artifact).where(Artifact.id == artifact_id))
    if artifact is not None:
        require(level(session, user, artifact), Level.EDIT, f"artifact {artifact_id}")
        action = "updated"
    else:
        folder, action = place(session, user, body, Artifact, meta.name, "artifact")
        if action == "skipped":
            return {"id": artifact_id, "action": action, "folder": folder.path, "cursors": {}}
        artifact = Artifact(id=artifact_id, folder_id=folder.id, owner_id=user.id)
        session.add(artifact)
    artifact.name, artifact.labels, artifact.description = meta.name, list(meta.labels), meta.description
    artifact.created, artifact.uploaded = meta.created, now()
    artifact.references = [r.model_dump() for r in meta.references]
    session.flush()
    old = {f.path: f for f in session.scalars(select(ArtifactFile).where(ArtifactFile.artifact_pk == artifact.pk))}
    for path, f in files.items():
        row = old.get(path)
        if row is None:
            session.add(ArtifactFile(artifact_pk=artifact.pk, path=path, size=f.size, sha256=f.sha256))
        else:
            row.size, row.sha256 = f.size, f.sha256
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
        "lineage": ingest.edges_of(session, artifact.id),
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
    artifact = get_artifact(session, user, artifact_id)
    row = session.scalar(
        select(ArtifactFile).where(
            ArtifactFile.artifact_pk == artifact.pk, ArtifactFile.path == naming.rel_path(path, "file path")
        )
    )
    if row is None:
        raise HTTPException(404, f"artifact {artifact_id} has no file {path!r}")
    blob = _store(request).path(row.sha256)
    if not blob.is_file():
        raise HTTPException(410, f"the stored bytes of {path!r} are missing from the server's data folder")
    return FileResponse(blob, filename=row.path.rsplit("/", 1)[-1], media_type="application/octet-stream")


@router.post("/{artifact_id}/lineage", summary="Append complete lines of the artifact's lineage.jsonl")
def post_lineage(artifact_id: str, batch: LineageBatch, user: CurrentUser, session: DbSession):
    artifact = get_artifact(session, user, artifact_id, Level.EDIT)
    return {"cursor": ingest.store_edges(session, artifact.id, batch.edges, batch.start, batch.end)}


@router.delete("/{artifact_id}", summary="Delete an artifact (its blobs stay while other artifacts use them)")
def delete_artifact(artifact_id: str, user: CurrentUser, session: DbSession):
    artifact = get_artifact(session, user, artifact_id, Level.EDIT)
    session.execute(delete(Cursor).where(Cursor.node_id == artifact.id))
    drop_shares(session, "artifact", artifact.pk)
    session.delete(artifact)
    return {"id": artifact_id, "deleted": True}
