"""``/api/v1/blobs`` and ``/api/v1/artifacts``: content-addressed files and the artifacts listing them."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from ember.server.api.auth import BriefUser, CurrentUser, DbSession, Receiving
from ember.server.api.responses import file_response
from ember.server.api.wire import CheckedRoute, LineageDepth
from ember.server.services import artifacts, edges, naming
from ember.server.services import blobs as blob_rules
from ember.server.services.blobs import BlobStore
from ember.server.services.lookup import get_artifact, get_artifact_file
from ember.server.storage.domain_errors import TooLarge
from ember.server.storage.schemas import ArtifactIn, BlobQuery, LineageBatch
from ember.server.storage.settings import Settings

blobs = APIRouter(prefix="/blobs", tags=["artifacts"], route_class=CheckedRoute)
router = APIRouter(prefix="/artifacts", tags=["artifacts"], route_class=CheckedRoute)


def _store(request: Request) -> BlobStore:
    return request.app.state.blobs


@blobs.post("/missing", summary="Which of these blobs you have not uploaded yet (send only those)")
def missing_blobs(query: BlobQuery, uploads: Receiving):
    """Answers from the caller's own uploads: whether anyone else holds the bytes is not told."""
    return {"missing": sorted(uploads.missing_blobs(query.sha256))}


@blobs.put("/{sha256}", summary="Upload one file's bytes; stored only when they hash to the URL's sha256")
async def put_blob(sha256: str, request: Request, user: BriefUser):
    """Streams the bytes to a temporary file (in worker threads), then records them in a worker thread.

    Nothing here touches the database or a file on the event loop: on SQLite a transaction
    waiting there for the write lock would stop every other request of the process.
    """
    sha = naming.sha256(sha256)
    settings: Settings = request.app.state.settings
    used = None
    if settings.quota_bytes is not None:
        used = await run_in_threadpool(blob_rules.usage_now, request.app.state.read_sessions, user, settings)
    limit, limit_text = blob_rules.upload_limit(settings, user, used)
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise TooLarge(limit_text)
    store = _store(request)
    tmp = await store.receive(sha, request.stream(), limit, limit_text)
    try:
        size = await run_in_threadpool(blob_rules.record, request.app.state.sessions, store, settings, user, sha, tmp)
    finally:
        await run_in_threadpool(tmp.unlink, True)
    return {"sha256": sha, "size": size}


@router.put("/{artifact_id}", summary="Create or update an artifact; every file's blob must be uploaded first")
def put_artifact(artifact_id: str, body: ArtifactIn, uploads: Receiving):
    """The file list is sent whole: the artifact then holds exactly these files.

    A blob may be listed only by a user who uploaded it or who can view an artifact holding it;
    any other digest is answered like one never uploaded (409), so digests reveal nothing.
    """
    return uploads.put_artifact(artifact_id, body)


@router.get("/{artifact_id}", summary="An artifact: metadata, files with sha256 and size, references, lineage")
def read_artifact(artifact_id: str, user: CurrentUser, session: DbSession, depth: LineageDepth = "1"):
    """``depth`` as for ``GET /runs/{id}``: the lineage's levels each way, or ``all``."""
    return artifacts.artifact_view(session, user, get_artifact(session, user, artifact_id), edges.parse_depth(depth))


@router.get("/{artifact_id}/files/{path:path}", summary="Download one file of an artifact")
def download(
    artifact_id: str,
    path: str,
    request: Request,
    user: CurrentUser,
    session: DbSession,
):
    return file_response(_store(request), get_artifact_file(session, user, artifact_id, path))


@router.post("/{artifact_id}/lineage", summary="Append complete lines of the artifact's lineage.jsonl")
def post_lineage(artifact_id: str, batch: LineageBatch, uploads: Receiving):
    return {"cursor": uploads.put_lineage("artifact", artifact_id, batch)}


@router.delete("/{artifact_id}", summary="Delete an artifact, and the blobs no other artifact lists")
def delete_artifact(artifact_id: str, uploads: Receiving):
    return uploads.delete_artifact(artifact_id)
