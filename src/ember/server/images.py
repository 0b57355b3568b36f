"""Images a run logged: ``POST /runs/{id}/images`` (upload, idempotent), the list and each PNG.

The client sends complete lines of the run's ``images.jsonl`` from its cursor, each with its
PNG (base64). Rows go in with ``ON CONFLICT DO NOTHING`` on (run, name, step) and the cursor
``images.jsonl`` moves in the same transaction, as the metrics do (``ingest.py``): a retry
adds nothing, a range past the cursor is a 409. PNGs are kept in the database (``run_images``),
at most :data:`MAX_PNG_BYTES` each; only PNG is accepted, so an image is always served as
``image/png`` with ``nosniff``.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from ember.server import ingest
from ember.server.auth import CurrentUser, DbSession
from ember.server.models import Run, RunImage
from ember.server.perms import Level
from ember.server.routes_runs import get_run
from ember.server.schemas import Count, Number
from ember.server.wire import CheckedRoute
from ember.track.images import MAX_PNG_BYTES, NAME

router = APIRouter(prefix="/runs", tags=["runs"], route_class=CheckedRoute)
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
    """The ``run_images`` rows of a batch (422 for a file that is not a PNG, 413 for one too large)."""
    rows = []
    for image in images:
        try:
            data = base64.b64decode(image.png, validate=True)
        except (binascii.Error, ValueError):
            raise HTTPException(422, f"image {image.name!r} at step {image.step}: png is not base64") from None
        if len(data) > MAX_PNG_BYTES:
            raise HTTPException(413, f"image {image.name!r} at step {image.step}: over {MAX_PNG_BYTES} bytes")
        if len(data) < 24 or data[:8] != _PNG or data[12:16] != b"IHDR":
            raise HTTPException(422, f"image {image.name!r} at step {image.step}: not a PNG file")
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
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


def store_images(session: Session, run: Run, batch: ImagesBatch) -> int:
    """Insert a batch's images (each (name, step) once) and move the cursor; return it."""
    ingest.lock_cursor(session, run.id, STREAM)
    ingest.check_start(session, run.id, STREAM, batch.start, batch.end)
    ingest.insert_ignore(session, RunImage, image_rows(run.pk, batch.images), ["run_pk", "name", "step"])
    return ingest.advance(session, run.id, STREAM, batch.end)


def list_images(session: Session, run_pk: int) -> list[dict[str, Any]]:
    """Every image of a run without its bytes, by name then step."""
    cols = (RunImage.name, RunImage.step, RunImage.time, RunImage.width, RunImage.height, RunImage.size)
    rows = session.execute(select(*cols).where(RunImage.run_pk == run_pk).order_by(RunImage.name, RunImage.step))
    return [dict(r._mapping) for r in rows]


def png_response(session: Session, run_pk: int, name: str, step: int) -> Response:
    """One image's PNG: ``image/png``, ``nosniff``, cacheable (an image never changes)."""
    data = session.scalar(
        select(RunImage.png).where(RunImage.run_pk == run_pk, RunImage.name == name, RunImage.step == step)
    )
    if data is None:
        raise HTTPException(404, f"no image {name!r} at step {step}")
    return Response(
        bytes(data),
        media_type="image/png",
        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "private, max-age=86400"},
    )


def checked_name(name: str) -> str:
    """A name from a URL path (422 when it is not an image name)."""
    if not re.fullmatch(NAME.pattern, name):
        raise HTTPException(422, f"{name!r} is not an image name")
    return name


@router.post("/{run_id}/images", summary="Append complete lines of the run's images.jsonl with their PNGs (idempotent)")
def post_images(run_id: str, batch: ImagesBatch, user: CurrentUser, session: DbSession):
    run = get_run(session, user, run_id, Level.EDIT)
    return {"cursor": store_images(session, run, batch)}


@router.get("/{run_id}/images", summary="The images a run logged (name, step, time, width, height, size)")
def read_images(run_id: str, user: CurrentUser, session: DbSession):
    run = get_run(session, user, run_id)
    return {"images": list_images(session, run.pk)}


@router.get("/{run_id}/images/{step}/{name:path}", summary="One image as PNG")
def read_png(
    run_id: str, step: Annotated[int, Path(ge=0)], name: str, user: CurrentUser, session: DbSession
) -> Response:
    run = get_run(session, user, run_id)
    return png_response(session, run.pk, checked_name(name), step)
