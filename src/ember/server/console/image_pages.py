"""What the image panels fetch: a run's images (the run page's ``images.js``), those of the runs
compared (the compare page's ``compare_images.js``), and each PNG."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from ember.server.api.auth import DbSession
from ember.server.api.responses import png_response
from ember.server.api.wire import SafeJSONResponse
from ember.server.console.session import PREFIX, require_viewer
from ember.server.console.views import DataRoute, secure
from ember.server.services import run_images
from ember.server.services.lookup import get_run

router = APIRouter(prefix=PREFIX, route_class=DataRoute, include_in_schema=False)


@router.get("/runs/{run_id}/images")
def images_of_run(run_id: str, request: Request, session: DbSession) -> Response:
    """``{"images": [{"name", "step", "time", "width", "height", "size"}, ...]}`` by name then step."""
    user = require_viewer(request, session)
    run = get_run(session, user, run_id)
    response = SafeJSONResponse({"images": run_images.list_images(session, run.pk)})
    secure(response)
    return response


@router.get("/images")
def images_of_runs(request: Request, session: DbSession, ids: Annotated[list[str], Query(max_length=500)]) -> Response:
    """``{"runs": {id: [{"name", "step", "time", "width", "height"}, ...]}}`` for the runs named (each one
    you may view; 404 otherwise), those with images only."""
    user = require_viewer(request, session)
    runs = [get_run(session, user, run_id) for run_id in dict.fromkeys(ids)]
    found = run_images.images_of_runs(session, [r.pk for r in runs])
    response = SafeJSONResponse({"runs": {r.id: found[r.pk] for r in runs if r.pk in found}})
    secure(response)
    return response


@router.get("/runs/{run_id}/images/{step}/{name:path}")
def run_image(
    run_id: str, step: Annotated[int, Path(ge=0)], name: str, request: Request, session: DbSession
) -> Response:
    user = require_viewer(request, session)
    run = get_run(session, user, run_id)
    response = png_response(run_images.png_bytes(session, run.pk, run_images.checked_name(name), step))
    response.headers["Content-Security-Policy"] = "default-src 'none'; sandbox"
    return response
