"""``/api/v1/runs``: upload a run (metadata, metrics, stdout, lineage), read it back, edit it, trash it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from ember.server.api.auth import CurrentUser, DbSession, Receiving
from ember.server.api.responses import metrics_download
from ember.server.api.run_search import RunSearchQuery
from ember.server.api.wire import CheckedRoute, LineageDepth, SafeJSONResponse
from ember.server.services import edges, logs, runs
from ember.server.services.lookup import get_run
from ember.server.services.series import MAX_BUCKETS
from ember.server.storage.schemas import LineageBatch, LogChunkIn, MetricBatch, RunEdit, RunIn, RunPageOut

router = APIRouter(prefix="/runs", tags=["runs"], route_class=CheckedRoute)
# not GET /runs: '/runs/' must stay a bad run id
search = APIRouter(prefix="/search", tags=["runs"], route_class=CheckedRoute)
trash = APIRouter(prefix="/trash", tags=["runs"], route_class=CheckedRoute)
MetricType = Annotated[str, Query(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]


@router.put("/{run_id}", summary="Create or update a run from its run.json and platform.json")
def put_run(run_id: str, body: RunIn, uploads: Receiving):
    """Idempotent: the same run (by id) is updated in place; ``cursors`` says what the server has."""
    return uploads.put_run(run_id, body)


@search.get(
    "/runs",
    summary="The runs you may view: filtered, sorted, one page at a time",
    response_model=RunPageOut,
    response_class=SafeJSONResponse,
)
def search_runs(
    user: CurrentUser,
    session: DbSession,
    query: RunSearchQuery,
    text: Annotated[str, Query(alias="filter", max_length=2000, description="m:val/acc.best>0.9 and hp:lr<0.1")] = "",
    where: Annotated[list[str] | None, Query(max_length=20, description="more filters, all must hold")] = None,
):
    """Paginated on the server; only runs the caller has view rights on are ever considered."""
    return RunPageOut(**query.runs(session, user, [text, *(where or [])]).__dict__)


@router.get("/{run_id}/series", summary="Every metric of a type, downsampled (min and max per bucket) for charts")
def read_series(
    run_id: str,
    type: MetricType,
    request: Request,
    user: CurrentUser,
    session: DbSession,
    buckets: Annotated[int, Query(ge=10, le=MAX_BUCKETS)] = 1000,
    start: Annotated[int | None, Query(ge=0, description="first step of a range (a zoomed chart)")] = None,
    end: Annotated[int | None, Query(ge=0, description="last step of a range, included")] = None,
):
    run = get_run(session, user, run_id)
    found = request.app.state.series.series(session, run.pk, run.id, type, buckets, start, end)
    return SafeJSONResponse({"id": run.id, "status": run.status, **found})


@router.get("/{run_id}/metrics.csv", summary="Every point of one metric type as CSV (step, epoch, time, name, value)")
def read_metrics_csv(
    run_id: str, type: MetricType, request: Request, user: CurrentUser, session: DbSession
) -> StreamingResponse:
    run = get_run(session, user, run_id)
    return metrics_download(request, run, type, "csv", f"{run.id}-{type}.csv")


@router.get("/{run_id}", summary="A run: metadata, hparams, platform, metric summary, lineage")
def read_run(run_id: str, user: CurrentUser, session: DbSession, depth: LineageDepth = "1"):
    """``depth``: the lineage's levels of inputs and outputs (``1`` the neighbours, ``all`` every level,
    bounded by :data:`ember.server.services.edges.MAX_EDGES` and ``MAX_NODES``)."""
    return runs.run_view(session, user, get_run(session, user, run_id), edges.parse_depth(depth))


@router.get("/{run_id}/metrics", summary="Every point of one metric type, as the local store writes them")
def read_metrics(
    run_id: str, type: MetricType, request: Request, user: CurrentUser, session: DbSession
) -> StreamingResponse:
    run = get_run(session, user, run_id)
    return metrics_download(request, run, type, "json", f"{run.id}-{type}.json")


@router.post("/{run_id}/metrics", summary="Append complete lines of metrics/<type>.jsonl (idempotent)")
def post_metrics(run_id: str, batch: MetricBatch, uploads: Receiving):
    return {"cursor": uploads.put_metrics(run_id, batch)}


@router.post("/{run_id}/log", summary="Append text of stdout.log from a byte offset (idempotent)")
def post_log(run_id: str, chunk: LogChunkIn, uploads: Receiving):
    """413 past the server's output limit per run (``--max-log-mb``) or the owner's quota; nothing is kept."""
    return {"cursor": uploads.put_log(run_id, chunk)}


@router.get("/{run_id}/log", summary="The stdout.log text stored, a few MiB at a time from offset")
def read_log(
    run_id: str,
    user: CurrentUser,
    session: DbSession,
    offset: Annotated[int, Query(ge=0, description="a byte of the stored text (next_offset of the answer before)")] = 0,
):
    """``{"text", "offset", "next_offset"}``: whole pieces from the one holding ``offset``, about 4 MiB at
    most; ``next_offset`` continues (null at the end)."""
    run = get_run(session, user, run_id)
    return logs.text_from(session, run.pk, offset)


@router.post("/{run_id}/lineage", summary="Append complete lines of the run's lineage.jsonl (idempotent)")
def post_lineage(run_id: str, batch: LineageBatch, uploads: Receiving):
    return {"cursor": uploads.put_lineage("run", run_id, batch)}


@router.patch("/{run_id}", summary="Rename a run, set its labels or its description (edit right)")
def edit_run(run_id: str, body: RunEdit, user: CurrentUser, session: DbSession):
    """The fields given are set; an upload of the run's run.json leaves them alone from then on."""
    return runs.edit_run(session, user, run_id, body)


@router.delete("/{run_id}", summary="Move a run to the trash, or with purge=true delete it and its points now")
def delete_run(
    run_id: str,
    user: CurrentUser,
    session: DbSession,
    uploads: Receiving,
    purge: Annotated[bool, Query(description="delete now, in the trash or not, instead of moving it there")] = False,
):
    """In the trash a run is hidden everywhere, restorable (``POST /runs/{id}/restore``), and purged
    after :data:`ember.server.services.runs.TRASH_DAYS` days."""
    if purge:
        return uploads.delete_run(run_id)
    return runs.trash_run(session, user, run_id)


@router.post("/{run_id}/restore", summary="Take a run out of the trash")
def restore_run(run_id: str, user: CurrentUser, session: DbSession):
    return runs.restore_run(session, user, run_id)


@trash.get("", summary="The runs in the trash that you may restore or purge")
def list_trash(user: CurrentUser, session: DbSession):
    return {"runs": runs.trash_of(session, user), "purge_after_days": runs.TRASH_DAYS}
