"""``/api/v1/runs/{id}/images``: upload a run's images (idempotent), list them, read each PNG.

The rules (PNG only, size limit, the ``images.jsonl`` cursor) are :mod:`ember.server.services.run_images`'.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import Response

from ember.server.api.auth import CurrentUser, DbSession, Receiving
from ember.server.api.responses import png_response
from ember.server.api.wire import CheckedRoute
from ember.server.services import run_images
from ember.server.services.lookup import get_run

router = APIRouter(prefix="/runs", tags=["runs"], route_class=CheckedRoute)


@router.post("/{run_id}/images", summary="Append complete lines of the run's images.jsonl with their PNGs (idempotent)")
def post_images(run_id: str, batch: run_images.ImagesBatch, uploads: Receiving):
    return {"cursor": uploads.put_images(run_id, batch)}


@router.get("/{run_id}/images", summary="The images a run logged (name, step, time, width, height, size)")
def read_images(run_id: str, user: CurrentUser, session: DbSession):
    run = get_run(session, user, run_id)
    return {"images": run_images.list_images(session, run.pk)}


@router.get("/{run_id}/images/{step}/{name:path}", summary="One image as PNG")
def read_png(
    run_id: str, step: Annotated[int, Path(ge=0)], name: str, user: CurrentUser, session: DbSession
) -> Response:
    run = get_run(session, user, run_id)
    return png_response(run_images.png_bytes(session, run.pk, run_images.checked_name(name), step))
