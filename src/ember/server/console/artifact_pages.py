"""The artifact page with inline previews of its files, and the image route those previews use.

What is previewed, and how it is served (never as HTML, never sniffed):

- images (PNG, JPEG, GIF, WebP), recognised by their first bytes, not their name: served by
  ``/ui/artifacts/{id}/preview/{path}`` as that image type with ``nosniff``, ``inline`` and a
  CSP ``sandbox``; up to :data:`MAX_IMAGE_BYTES`, and only when their header gives a size of
  at most :data:`MAX_PIXELS` (a small file can claim a huge picture, which a browser would try
  to decode). SVG is not previewed (it can hold script).
- text (``.txt``, ``.log``, ``.md``, ``.yaml``, ``.py``...), JSON (pretty-printed), CSV/TSV (the
  first :data:`CSV_ROWS` rows as a table): the first :data:`MAX_TEXT_BYTES` bytes, decoded as
  UTF-8 and put in the page by the autoescaping template.
- anything else, HTML included, is only downloadable.

Whatever the bytes, a file is previewed or shown as not previewed with the reason (JSON nested
too deeply, a CSV the reader refuses, an image whose size cannot be read or is too large):
the page never fails because of a file.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, Response
from sqlalchemy import func, select

from ember.server.api.auth import DbSession
from ember.server.api.wire import LineageDepth, content_disposition
from ember.server.console.lineage_pages import graph_of
from ember.server.console.session import PREFIX, require_viewer
from ember.server.console.views import ConsoleRoute, crumbs, render
from ember.server.services import edges
from ember.server.services.blobs import BlobStore
from ember.server.services.lookup import get_artifact, get_artifact_file
from ember.server.storage.models import ArtifactFile, Folder

router = APIRouter(prefix=PREFIX, route_class=ConsoleRoute, include_in_schema=False)
MAX_TEXT_BYTES = 64 * 1024
MAX_JSON_BYTES = 1024 * 1024
MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_PIXELS = 50_000_000
MAX_PREVIEWS = 20
MAX_LISTED = 1_000
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


def image_size(head: bytes, media: str) -> tuple[int, int] | None:
    """The width and height an image's first bytes declare; None when they do not hold them."""
    if media == "image/png":
        return (_be(head, 16, 4), _be(head, 20, 4)) if head[12:16] == b"IHDR" and len(head) >= 24 else None
    if media == "image/gif":
        return (_le(head, 6, 2), _le(head, 8, 2)) if len(head) >= 10 else None
    if media == "image/webp":
        return _webp_size(head)
    return _jpeg_size(head)


def _be(data: bytes, at: int, size: int) -> int:
    return int.from_bytes(data[at : at + size], "big")


def _le(data: bytes, at: int, size: int) -> int:
    return int.from_bytes(data[at : at + size], "little")


def _webp_size(head: bytes) -> tuple[int, int] | None:
    chunk = head[12:16]
    if chunk == b"VP8 " and len(head) >= 30:
        return _le(head, 26, 2) & 0x3FFF, _le(head, 28, 2) & 0x3FFF
    if chunk == b"VP8L" and len(head) >= 25:
        bits = _le(head, 21, 4)
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(head) >= 30:
        return _le(head, 24, 3) + 1, _le(head, 27, 3) + 1
    return None


def _jpeg_size(head: bytes) -> tuple[int, int] | None:
    """The size in a JPEG's frame header (SOF0-SOF15 but DHT, JPG, DAC), walking the segments before it."""
    at = 2
    while at + 9 <= len(head):
        if head[at] != 0xFF:
            return None
        marker = head[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return _be(head, at + 7, 2), _be(head, at + 5, 2)
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
            at += 2
            continue
        at += 2 + _be(head, at + 2, 2)
    return None


def _image_note(head: bytes, media: str, size: int) -> str | None:
    """Why an image file is not previewed (None: it is)."""
    if size > MAX_IMAGE_BYTES:
        return f"an image over {MAX_IMAGE_BYTES // 2**20} MiB: download it"
    found = image_size(head, media)
    if found is None:
        return f"its size as an image is not in its first {MAX_TEXT_BYTES // 1024} KiB (a damaged image?): download it"
    width, height = found
    if not width or not height or width * height > MAX_PIXELS:
        return f"an image of {width} x {height} pixels, over the {MAX_PIXELS:,} a preview shows: download it"
    return None


def _head(store: BlobStore, sha: str, size: int) -> bytes:
    with open(store.path(sha), "rb") as f:
        return f.read(size)


def preview(store: BlobStore, row: ArtifactFile) -> Preview:
    """How one file is previewed (reads at most :data:`MAX_JSON_BYTES` of it); never raises for its bytes."""
    suffix = PurePosixPath(row.path).suffix.lower()
    if suffix in (".svg", ".svgz", ".html", ".htm", ".xhtml", ".xml"):
        return Preview(row.path, "none", note="not previewed (it could run script in the page): download it")
    try:
        head = _head(store, row.sha256, MAX_JSON_BYTES if suffix == ".json" else MAX_TEXT_BYTES)
    except OSError:
        return Preview(row.path, "none", note="its stored bytes are missing")
    media = image_type(head)
    if media:
        note = _image_note(head[:MAX_TEXT_BYTES], media, row.size)
        return Preview(row.path, "none", note=note) if note else Preview(row.path, "image")
    if suffix not in TEXT_SUFFIXES | {".json", ".csv", ".tsv"}:
        return Preview(row.path, "none")
    if b"\x00" in head:
        return Preview(row.path, "none", note="binary (it holds NUL bytes): download it")
    cut = row.size > len(head)
    text = head.decode("utf-8", "replace")
    if suffix == ".json" and not cut:
        try:
            text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
            return Preview(row.path, "json", text=text[:MAX_TEXT_BYTES], cut=len(text) > MAX_TEXT_BYTES)
        except RecursionError:
            return Preview(row.path, "none", note="JSON nested too deeply to show: download it")
        except ValueError:  # not JSON (or a number too long to read): shown as text
            pass
    if suffix in (".csv", ".tsv"):
        lines = text.splitlines()[: CSV_ROWS + 1]
        try:
            rows = list(csv.reader(io.StringIO("\n".join(lines)), delimiter="\t" if suffix == ".tsv" else ","))
        except csv.Error as e:
            return Preview(row.path, "none", note=f"not read as {suffix[1:].upper()} ({e}): download it")
        return Preview(row.path, "csv", rows=rows, cut=cut or len(text.splitlines()) > CSV_ROWS + 1)
    text = text[:MAX_TEXT_BYTES]
    return Preview(row.path, "text", text=text, cut=cut or len(text) < len(head.decode("utf-8", "replace")))


@router.get("/artifacts/{artifact_id}")
def artifact_page(
    artifact_id: str, request: Request, session: DbSession, lineage_depth: LineageDepth = "1"
) -> Response:
    user = require_viewer(request, session)
    art = get_artifact(session, user, artifact_id)
    folder = session.scalar(select(Folder.path).where(Folder.id == art.folder_id)) or ""
    count, total = session.execute(
        select(func.count(), func.coalesce(func.sum(ArtifactFile.size), 0)).where(ArtifactFile.artifact_pk == art.pk)
    ).one()
    files = session.scalars(  # the first MAX_LISTED, whatever the artifact holds
        select(ArtifactFile).where(ArtifactFile.artifact_pk == art.pk).order_by(ArtifactFile.path).limit(MAX_LISTED)
    ).all()
    lineage = edges.edges_of(session, "artifact", art.id, art.name, user, edges.parse_depth(lineage_depth))
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
        count=int(count),
        total=int(total),
        previews=[p for p in previews if p.kind != "none"],
        not_previewed={p.path: p.note for p in previews if p.kind == "none" and p.note},
        more=max(0, int(count) - MAX_PREVIEWS),
        graph=graph_of("artifact", art.id, art.name, lineage),
    )


@router.get("/artifacts/{artifact_id}/preview/{path:path}")
def preview_image(artifact_id: str, path: str, request: Request, session: DbSession) -> Response:
    """An artifact's image file for an ``<img>``: only a PNG, JPEG, GIF or WebP, typed by its bytes."""
    user = require_viewer(request, session)
    row = get_artifact_file(session, user, artifact_id, path)
    store: BlobStore = request.app.state.blobs
    try:
        head = _head(store, row.sha256, MAX_TEXT_BYTES)
    except OSError:
        raise HTTPException(410, f"the stored bytes of {row.path!r} are missing") from None
    media = image_type(head)
    note = _image_note(head, media, row.size) if media else "not an image"
    if media is None or note is not None:
        raise HTTPException(415, f"{row.path!r} is not previewed as an image ({note}): download it")
    disposition = content_disposition(row.path.rsplit("/", 1)[-1], "inline")
    headers = {
        "Content-Disposition": disposition,
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": IMAGE_CSP,
        "Cache-Control": "private, max-age=3600",
    }
    return FileResponse(store.path(row.sha256), media_type=media, headers=headers)
