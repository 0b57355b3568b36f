"""HTTP answers that both the API's routes and the console's build: file downloads, PNGs, metric streams.

Not a route module: a route module of the API (``routes_*.py``) or of the console calls these
after its service call, so that no route module imports another's handler.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import FileResponse, Response, StreamingResponse

from ember.server.api.wire import content_disposition
from ember.server.services import downloads
from ember.server.services.blobs import BlobStore
from ember.server.storage.domain_errors import Gone
from ember.server.storage.models import ArtifactFile, Run


def metrics_download(request: Request, run: Run, type_: str, fmt: str, filename: str) -> StreamingResponse:
    """Every point of a metric type as a streamed CSV or JSON attachment named ``filename``."""
    sessions = request.app.state.read_sessions
    body = downloads.csv_text(sessions, run.pk, type_) if fmt == "csv" else downloads.json_text(sessions, run.pk, type_)
    media = "text/csv; charset=utf-8" if fmt == "csv" else "application/json"
    return StreamingResponse(body, media_type=media, headers={"Content-Disposition": content_disposition(filename)})


def file_response(store: BlobStore, row: ArtifactFile) -> FileResponse:
    """An artifact file's bytes as an attachment (streamed from disk); 410 when they are gone."""
    blob = store.path(row.sha256)
    if not blob.is_file():
        raise Gone(f"the stored bytes of {row.path!r} are missing from the server's data folder")
    disposition = content_disposition(row.path.rsplit("/", 1)[-1])
    return FileResponse(blob, media_type="application/octet-stream", headers={"Content-Disposition": disposition})


def png_response(data: bytes) -> Response:
    """One image's PNG: ``image/png``, ``nosniff``, cacheable (an image never changes)."""
    return Response(
        data,
        media_type="image/png",
        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "private, max-age=86400"},
    )
