"""What the console's pages fetch or download: chart series, full metrics, files, plotly.js."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, Response

from ember.server.api.auth import DbSession
from ember.server.api.responses import file_response, metrics_download
from ember.server.console.session import PREFIX, require_viewer
from ember.server.console.views import DataRoute, secure
from ember.server.services import codec, liveness
from ember.server.services.lookup import get_artifact_file, get_run, get_runs
from ember.server.services.series import COMPARE_IDS, MAX_BUCKETS

router = APIRouter(prefix=PREFIX, route_class=DataRoute, include_in_schema=False)
MetricType = Annotated[str, Query(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]


# plotly.js 4.1.1 (plotly.js-dist-min, MIT: static/plotly.LICENSE), vendored: the 64 MB plotly
# Python package only served this one file (issue 22). The run page draws with uPlot instead.
PLOTLY_JS = Path(__file__).parent / "static" / "plotly.min.js"


@router.get("/vendor/plotly.min.js")
def vendor_plotly() -> Response:
    response = FileResponse(PLOTLY_JS, media_type="text/javascript")
    response.headers["Cache-Control"] = "public, max-age=86400"
    return response


@router.get("/runs/{run_id}/series")
def series(
    run_id: str,
    type: MetricType,
    request: Request,
    session: DbSession,
    buckets: Annotated[int, Query(ge=10, le=MAX_BUCKETS)] = 1000,
    start: Annotated[int | None, Query(ge=0, description="first step of a range (a zoomed chart)")] = None,
    end: Annotated[int | None, Query(ge=0, description="last step of a range, included")] = None,
) -> Response:
    user = require_viewer(request, session)
    run = get_run(session, user, run_id)
    head = {"id": run.id, "status": liveness.shown_status(run.status, run.meta)}
    body = request.app.state.series.series_json(session, run.pk, type, head, buckets, start, end)
    response = Response(body, media_type="application/json")
    secure(response)
    return response


@router.get("/compare/series")
def compare_series(
    type: MetricType,
    request: Request,
    session: DbSession,
    ids: Annotated[list[str], Query(min_length=1, max_length=COMPARE_IDS)],
    buckets: Annotated[int, Query(ge=10, le=MAX_BUCKETS)] = 1000,
) -> Response:
    """The series of one metric type of many runs: ``{"runs": {id: <the run's /series answer>}}``.

    Each run is checked as ``/runs/{id}/series`` checks it (a run the viewer may not see is a
    404 for the whole request, as for one run) and its answer is the same bytes, kept per run.
    """
    user = require_viewer(request, session)
    runs = get_runs(session, user, list(dict.fromkeys(ids)))
    heads = {run.pk: {"id": run.id, "status": liveness.shown_status(run.status, run.meta)} for run in runs}
    bodies = request.app.state.series.series_json_many(session, type, heads, buckets)
    parts = [codec.encode(run.id) + b":" + bodies[run.pk] for run in runs]
    response = Response(b'{"runs":{' + b",".join(parts) + b"}}", media_type="application/json")
    secure(response)
    return response


@router.get("/runs/{run_id}/metrics.csv")
def metrics_csv(run_id: str, type: MetricType, request: Request, session: DbSession) -> Response:
    user = require_viewer(request, session)
    run = get_run(session, user, run_id)
    return metrics_download(request, run, type, "csv", f"{run.name}-{type}.csv")


@router.get("/runs/{run_id}/metrics.json")
def metrics_json(run_id: str, type: MetricType, request: Request, session: DbSession) -> Response:
    user = require_viewer(request, session)
    run = get_run(session, user, run_id)
    return metrics_download(request, run, type, "json", f"{run.name}-{type}.json")


@router.get("/artifacts/{artifact_id}/files/{path:path}")
def download(artifact_id: str, path: str, request: Request, session: DbSession) -> Response:
    user = require_viewer(request, session)
    return file_response(request.app.state.blobs, get_artifact_file(session, user, artifact_id, path))
