"""The artifact page with inline previews of its files, and the image route those previews use.

What is previewed, and how it is served (never as HTML, never sniffed):

- images (PNG, JPEG, GIF, WebP), recognised by their first bytes, not their name: served by
  ``/ui/artifacts/{id}/preview/{path}`` as that image type with ``nosniff``, ``inline`` and a
  CSP ``sandbox``; up to :data:`MAX_IMAGE_BYTES`. SVG is not previewed (it can hold script).
- text (``.txt``, ``.log``, ``.md``, ``.yaml``, ``.py``...), JSON (pretty-printed), CSV/TSV (the
  first :data:`CSV_ROWS` rows as a table): the first :data:`MAX_TEXT_BYTES` bytes, decoded as
  UTF-8 and put in the page by the autoescaping template.
- anything else, HTML included, is only downloadable.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, Response
from sqlalchemy import select

from ember.server import ingest
from ember.server.auth import DbSession
from ember.server.blobs import BlobStore
from ember.server.console import lineage
from ember.server.console.session import PREFIX, require_viewer
from ember.server.console.views import ConsoleRoute, crumbs, render
from ember.server.lookup import get_artifact, get_artifact_file
from ember.server.models import ArtifactFile, Folder
from ember.server.wire import content_disposition

router = APIRouter(prefix=PREFIX, route_class=ConsoleRoute, include_in_schema=False)
MAX_TEXT_BYTES = 64 * 1024
MAX_JSON_BYTES = 1024 * 1024
MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_PREVIEWS = 20
CSV_ROWS = 50
TEXT_SUFFIXES = {
    ".txt", ".log", ".md", ".rst", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".conf", ".py", ".sh",
    ".jsonl", ".ndjson", ".out", ".err",
}  # fmt: skip
_IMAGES = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
IMAGE_CSP = "default-src 'none'; style-src 'unsafe-inline'; sandbox"


@dataclass
class Preview:
    """What the artifact page shows of one file: ``kind`` image, text, json, csv or none, and why not."""

    path: str
    kind: str
    text: str = ""
    rows: list[list[str]] = field(default_factory=list)
    cut: bool = False
    note: str = ""


def image_type(head: bytes) -> str | None:
    """The image media type that the first bytes of a file announce (PNG, JPEG, GIF, WebP), or None."""
    for magic, media in _IMAGES:
        if head.startswith(magic):
            return media
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def _head(store: BlobStore, sha: str, size: int) -> bytes:
    with open(store.path(sha), "rb") as f:
        return f.read(size)


def preview(store: BlobStore, row: ArtifactFile) -> Preview:
    """How one file is previewed (reads at most :data:`MAX_JSON_BYTES` of it)."""
    suffix = PurePosixPath(row.path).suffix.lower()
    if suffix in (".svg", ".svgz", ".html", ".htm", ".xhtml", ".xml"):
        return Preview(row.path, "none", note="not previewed (it could run script in the page): download it")
    try:
        head = _head(store, row.sha256, MAX_JSON_BYTES if suffix == ".json" else MAX_TEXT_BYTES)
    except OSError:
        return Preview(row.path, "none", note="its stored bytes are missing")
    if image_type(head):
        if row.size > MAX_IMAGE_BYTES:
            return Preview(row.path, "none", note=f"an image over {MAX_IMAGE_BYTES // 2**20} MiB: download it")
        return Preview(row.path, "image")
    if suffix not in TEXT_SUFFIXES | {".json", ".csv", ".tsv"} or b"\x00" in head[:8192]:
        return Preview(row.path, "none")
    cut = row.size > len(head)
    text = head.decode("utf-8", "replace")
    if suffix == ".json" and not cut:
        try:
            text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
            return Preview(row.path, "json", text=text[:MAX_TEXT_BYTES], cut=len(text) > MAX_TEXT_BYTES)
        except ValueError:
            pass
    if suffix in (".csv", ".tsv"):
        lines = text.splitlines()[: CSV_ROWS + 1]
        rows = list(csv.reader(io.StringIO("\n".join(lines)), delimiter="\t" if suffix == ".tsv" else ","))
        return Preview(row.path, "csv", rows=rows, cut=cut or len(text.splitlines()) > CSV_ROWS + 1)
    text = text[:MAX_TEXT_BYTES]
    return Preview(row.path, "text", text=text, cut=cut or len(text) < len(head.decode("utf-8", "replace")))


@router.get("/artifacts/{artifact_id}")
def artifact_page(artifact_id: str, request: Request, session: DbSession) -> Response:
    user = require_viewer(request, session)
    art = get_artifact(session, user, artifact_id)
    folder = session.scalar(select(Folder.path).where(Folder.id == art.folder_id)) or ""
    files = session.scalars(
        select(ArtifactFile).where(ArtifactFile.artifact_pk == art.pk).order_by(ArtifactFile.path)
    ).all()
    edges = ingest.edges_of(session, art.id, user)
    store: BlobStore = request.app.state.blobs
    previews = [preview(store, f) for f in files[:MAX_PREVIEWS]]
    return render(
        request,
        "artifact.html",
        user=user,
        art=art,
        folder=folder,
        crumbs=crumbs(folder),
        files=files,
        total=sum(f.size for f in files),
        previews=[p for p in previews if p.kind != "none"],
        not_previewed={p.path: p.note for p in previews if p.kind == "none" and p.note},
        more=max(0, len(files) - MAX_PREVIEWS),
        graph=lineage.graph("artifact", art.id, art.name, edges),
    )


@router.get("/artifacts/{artifact_id}/preview/{path:path}")
def preview_image(artifact_id: str, path: str, request: Request, session: DbSession) -> Response:
    """An artifact's image file for an ``<img>``: only a PNG, JPEG, GIF or WebP, typed by its bytes."""
    user = require_viewer(request, session)
    row = get_artifact_file(session, user, artifact_id, path)
    store: BlobStore = request.app.state.blobs
    try:
        media = image_type(_head(store, row.sha256, 16))
    except OSError:
        raise HTTPException(410, f"the stored bytes of {row.path!r} are missing") from None
    if media is None or row.size > MAX_IMAGE_BYTES:
        raise HTTPException(415, f"{row.path!r} is not previewed as an image: download it")
    disposition = content_disposition(row.path.rsplit("/", 1)[-1], "inline")
    headers = {
        "Content-Disposition": disposition,
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": IMAGE_CSP,
        "Cache-Control": "private, max-age=3600",
    }
    return FileResponse(store.path(row.sha256), media_type=media, headers=headers)
