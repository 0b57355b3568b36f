"""Images a run logged: store a batch (idempotent), list them, read one PNG (routes: ``routes_images``).

The client sends complete lines of the run's ``images.jsonl`` from its cursor, each with its
PNG (base64). Rows go in with ``ON CONFLICT DO NOTHING`` on (run, name, step) and the cursor
``images.jsonl`` moves in the same transaction, as the metrics do (``ingest.py``): a retry
adds nothing, a range past the cursor is a 409. PNGs are kept in the database (``run_images``),
at most :data:`MAX_PNG_BYTES` each; only PNG is accepted, so an image is always served as
``image/png`` with ``nosniff``. A server bounds them: at most ``max_run_images`` per run, and
their bytes count in the run's owner's storage quota (:func:`ember.server.services.blobs.usage`); a batch
over either is refused whole (413) and nothing of it is kept. A batch locks the owner's row, then the
cursor (the order of :mod:`ember.server.services.perms`).
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ember.server.services import blobs, ingest
from ember.server.storage.domain_errors import Invalid, NotFound, TooLarge
from ember.server.storage.models import Run, RunImage
from ember.server.storage.schemas import Count, Number
from ember.track.images import MAX_PNG_BYTES, MAX_SIDE, NAME

STREAM = "images.jsonl"
_PNG = b"\x89PNG\r\n\x1a\n"
ImageName = Annotated[str, Field(min_length=1, max_length=200, pattern=NAME.pattern)]


class ImageIn(BaseModel):
    """One line of ``images.jsonl`` with its PNG."""

    model_config = ConfigDict(extra="forbid")
    name: ImageName
    step: Count
    time: Number
    png: Annotated[str, Field(max_length=(MAX_PNG_BYTES * 4) // 3 + 4)]


class ImagesBatch(BaseModel):
    """Complete lines of a run's ``images.jsonl`` from byte ``start`` to byte ``end``."""

    model_config = ConfigDict(extra="forbid")
    start: Count
    end: Count
    images: list[ImageIn]


def image_rows(run_pk: int, images: list[ImageIn]) -> list[dict[str, Any]]:
    """The ``run_images`` rows of a batch (422 for a file that is not a PNG or claims a side over
    ``MAX_SIDE`` pixels, 413 for one too large)."""
    rows = []
    for image in images:
        try:
            data = base64.b64decode(image.png, validate=True)
        except (binascii.Error, ValueError):
            raise Invalid(f"image {image.name!r} at step {image.step}: png is not base64") from None
        if len(data) > MAX_PNG_BYTES:
            raise TooLarge(f"image {image.name!r} at step {image.step}: over {MAX_PNG_BYTES} bytes")
        if len(data) < 24 or data[:8] != _PNG or data[12:16] != b"IHDR":
            raise Invalid(f"image {image.name!r} at step {image.step}: not a PNG file")
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE):  # what run.log_image makes, no more
            raise Invalid(
                f"image {image.name!r} at step {image.step}: {width} x {height} pixels; each side must be 1 to "
                f"{MAX_SIDE} (a browser would try to draw it whole)"
            )
        rows.append(
            {
                "run_pk": run_pk,
                "name": image.name,
                "step": image.step,
                "time": image.time,
                "width": width,
                "height": height,
                "size": len(data),
                "png": data,
            }
        )
    return rows


def store_images(session: Session, run: Run, batch: ImagesBatch, max_images: int | None, quota: int | None) -> int:
    """Insert a batch's images (each (name, step) once) and move the cursor; return it.

    Args:
        max_images: the most images the run may hold; ``quota``: the most bytes its owner may
            hold (:func:`ember.server.services.blobs.usage`). None: no limit (``ember ui``'s own store).

    Raises:
        TooLarge: 413 when the batch takes the run past ``max_images`` or its owner past
            ``quota``; the caller's transaction is rolled back, so nothing of the batch is kept.
    """
    blobs.hold(session, run.owner_id, quota)
    ingest.lock_cursor(session, "run", run.id, STREAM)
    ingest.check_start(session, "run", run.id, STREAM, batch.start, batch.end)
    rows = image_rows(run.pk, batch.images)
    ingest.insert_ignore(session, RunImage, rows, ["run_pk", "name", "step"])
    if max_images is not None:
        held = int(session.scalar(select(func.count()).where(RunImage.run_pk == run.pk)) or 0)
        if held > max_images:
            raise TooLarge(
                f"run {run.name!r} ({run.id}) would hold {held} images, over the server's limit of {max_images} "
                "per run: log images less often (every N steps), or ask an admin to raise "
                "`ember server --max-run-images`"
            )
    # every image sent counts, those a retry sent before too: the bound only gets looser
    blobs.charge(session, run.owner_id, sum(row["size"] for row in rows), quota)
    return ingest.advance(session, "run", run.id, STREAM, batch.end)


def list_images(session: Session, run_pk: int) -> list[dict[str, Any]]:
    """Every image of a run without its bytes, by name then step."""
    cols = (RunImage.name, RunImage.step, RunImage.time, RunImage.width, RunImage.height, RunImage.size)
    rows = session.execute(select(*cols).where(RunImage.run_pk == run_pk).order_by(RunImage.name, RunImage.step))
    return [dict(r._mapping) for r in rows]


def images_of_runs(session: Session, run_pks: list[int]) -> dict[int, list[dict[str, Any]]]:
    """Every image of several runs without their bytes (one query), by run, then name and step; a run
    with none is absent. The compare page's images side by side."""
    cols = (RunImage.run_pk, RunImage.name, RunImage.step, RunImage.time, RunImage.width, RunImage.height)
    out: dict[int, list[dict[str, Any]]] = {}
    rows = session.execute(
        select(*cols).where(RunImage.run_pk.in_(run_pks)).order_by(RunImage.run_pk, RunImage.name, RunImage.step)
    )
    for row in rows:
        item = dict(row._mapping)
        out.setdefault(item.pop("run_pk"), []).append(item)
    return out


def png_bytes(session: Session, run_pk: int, name: str, step: int) -> bytes:
    """One image's PNG (404 when the run has no image ``name`` at ``step``)."""
    data = session.scalar(
        select(RunImage.png).where(RunImage.run_pk == run_pk, RunImage.name == name, RunImage.step == step)
    )
    if data is None:
        raise NotFound(f"no image {name!r} at step {step}")
    return bytes(data)


def checked_name(name: str) -> str:
    """A name from a URL path (422 when it is not an image name)."""
    if not re.fullmatch(NAME.pattern, name):
        raise Invalid(f"{name!r} is not an image name")
    return name
