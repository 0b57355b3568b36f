"""``/api/v1/runs``: upload a run (metadata, metrics, stdout, lineage) and read it back."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from ember.server import downloads, ingest, listing, naming, series, wire
from ember.server.auth import CurrentUser, DbSession, now
from ember.server.models import Artifact, ArtifactFile, Cursor, Folder, Run, User
from ember.server.perms import Level, drop_shares, ensure_folder, level, require, shares_of
from ember.server.schemas import LineageBatch, LogChunkIn, MetricBatch, Placement, RunIn, RunPageOut
from ember.server.wire import CheckedRoute, SafeJSONResponse, content_disposition

router = APIRouter(prefix="/runs", tags=["runs"], route_class=CheckedRoute)
# not GET /runs: '/runs/' must stay a bad run id
search = APIRouter(prefix="/search", tags=["runs"], route_class=CheckedRoute)
STATUSES = ("Running", "Complete", "Failed", "Interrupted", "Preempted")
MetricType = Annotated[str, Query(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]


def get_run(session: Session, user: User, run_id: str, needed: Level = Level.VIEW) -> Run:
    """The run with this id if the caller has ``needed`` on it (404/403 otherwise)."""
    run = session.scalar(select(Run).where(Run.id == naming.node_id(run_id, "run id")))
    if run is None:
        raise HTTPException(404, f"run {run_id} does not exist or is not shared with you")
    require(level(session, user, run), needed, f"run {run_id}")
    return run


def checked_meta(body: RunIn, run_id: str) -> dict[str, Any]:
    """run.json and platform.json of a ``PUT /runs/{id}``, checked (422 naming what is wrong)."""
    wire.check(body.run, "run")
    wire.check(body.platform, "platform")
    meta = body.run
    if meta.get("id") != run_id:
        raise HTTPException(422, f"run.id {meta.get('id')!r} differs from the id in the URL {run_id!r}")
    naming.display_name(meta.get("name"), "run.name")  # type: ignore[arg-type]
    if meta.get("status") not in STATUSES:
        raise HTTPException(422, f"run.status {meta.get('status')!r} is not one of {', '.join(STATUSES)}")
    for key, kind in (("labels", list), ("hparams", dict), ("description", str)):
        if not isinstance(meta.get(key, kind()), kind):
            raise HTTPException(422, f"run.{key} must be a {kind.__name__}, got {type(meta.get(key)).__name__}")
    for key in ("start_time", "end_time"):
        if meta.get(key) is not None and not (isinstance(meta[key], str) and len(meta[key]) <= 40):
            raise HTTPException(422, f"run.{key} must be an ISO 8601 time or null")
    return meta


def apply_meta(run: Run, meta: dict[str, Any], platform: dict[str, Any]) -> None:
    """Set a run's columns from its checked run.json (and platform.json, when sent)."""
    run.name = meta["name"]
    run.status = meta["status"]
    run.start_time = meta.get("start_time")
    run.end_time = meta.get("end_time")
    run.labels = [str(x) for x in meta.get("labels", [])]
    run.description = meta.get("description", "")
    run.hparams = meta.get("hparams", {})
    run.meta = meta
    if platform:
        run.platform = platform
    run.uploaded = now()


def place(
    session: Session, user: User, body: Placement, model: type[Any], name: str, what: str
) -> tuple[Folder, str, set[str]]:
    """The folder for a new node, what the conflict strategy says to do (create or skip), and
    the blob digests of artifacts it replaced (to collect once they are no longer listed)."""
    folder = ensure_folder(session, user, body.folder, body.make_folder)
    same = session.scalars(select(model).where(model.folder_id == folder.id, model.name == name)).all()
    if not same or body.conflict_strategy == "new":
        return folder, "created", set()
    if body.conflict_strategy == "skip":
        return folder, "skipped", set()
    if body.conflict_strategy == "error":
        raise HTTPException(
            409, f"folder {folder.path!r} already holds a {what} named {name!r}; pass another conflict_strategy"
        )
    freed: set[str] = set()
    for old in same:  # replace
        require(level(session, user, old, folder), Level.EDIT, f"{what} {old.id}")
        if isinstance(old, Artifact):
            freed |= set(session.scalars(select(ArtifactFile.sha256).where(ArtifactFile.artifact_pk == old.pk)))
        session.execute(delete(Cursor).where(Cursor.node_id == old.id))
        drop_shares(session, what, old.pk)
        session.delete(old)
    session.flush()
    return folder, "created", freed


@router.put("/{run_id}", summary="Create or update a run from its run.json and platform.json")
def put_run(run_id: str, body: RunIn, user: CurrentUser, session: DbSession):
    """Idempotent: the same run (by id) is updated in place; ``cursors`` says what the server has."""
    meta = checked_meta(body, naming.node_id(run_id, "run id"))
    run = session.scalar(select(Run).where(Run.id == run_id))
    if run is not None:
        require(level(session, user, run), Level.EDIT, f"run {run_id}")
        apply_meta(run, meta, body.platform)
        action = "updated"
    else:
        folder, action, _ = place(session, user, body, Run, meta["name"], "run")
        if action == "skipped":
            return {"id": run_id, "action": action, "folder": folder.path, "cursors": {}}
        run = Run(id=run_id, folder_id=folder.id, owner_id=folder.owner_id, platform={})
        apply_meta(run, meta, body.platform)
        session.add(run)
        session.flush()
    folder_path = session.scalar(select(Folder.path).where(Folder.id == run.folder_id))
    return {"id": run_id, "action": action, "folder": folder_path, "cursors": ingest.cursors(session, run_id)}


@search.get(
    "/runs",
    summary="The runs you may view: filtered, sorted, one page at a time",
    response_model=RunPageOut,
    response_class=SafeJSONResponse,
)
def search_runs(
    user: CurrentUser,
    session: DbSession,
    folder: Annotated[str | None, Query(max_length=1024, description="only under this folder")] = None,
    q: Annotated[str, Query(max_length=200, description="part of the name")] = "",
    label: Annotated[str, Query(max_length=200)] = "",
    status: Annotated[str, Query(max_length=16)] = "",
    where: Annotated[list[str] | None, Query(max_length=20, description="hp:K OP V or m:TYPE/NAME OP V")] = None,
    sort: Annotated[str, Query(max_length=300, description="name|status|start|duration|folder|hp:K|m:T/N")] = "-start",
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
    per_page: Annotated[int, Query(ge=1, le=500)] = 50,
):
    """Paginated on the server; only runs the caller has view rights on are ever considered."""
    path = naming.folder_path(folder, home=f"/{user.name}") if folder else None
    found = listing.list_runs(
        session,
        user,
        folder=path,
        q=q,
        label=label,
        status=status,
        filters=where,
        sort=sort,
        page=page,
        per_page=per_page,
    )
    return RunPageOut(**found.__dict__)


@router.get("/{run_id}/series", summary="Every metric of a type, downsampled (min and max per bucket) for charts")
def read_series(
    run_id: str,
    type: MetricType,
    request: Request,
    user: CurrentUser,
    session: DbSession,
    buckets: Annotated[int, Query(ge=10, le=20_000)] = 1000,
    start: Annotated[int | None, Query(ge=0, description="first step of a range (a zoomed chart)")] = None,
    end: Annotated[int | None, Query(ge=0, description="last step of a range, included")] = None,
):
    run = get_run(session, user, run_id)
    found = request.app.state.series.series(session, run.pk, run.id, type, buckets, start, end)
    return SafeJSONResponse({"id": run.id, "status": run.status, **found})


def download(request: Request, run: Run, type_: str, fmt: str, filename: str) -> StreamingResponse:
    """Every point of a metric type as a streamed CSV or JSON attachment named ``filename``."""
    sessions = request.app.state.read_sessions
    body = downloads.csv_text(sessions, run.pk, type_) if fmt == "csv" else downloads.json_text(sessions, run.pk, type_)
    media = "text/csv; charset=utf-8" if fmt == "csv" else "application/json"
    return StreamingResponse(body, media_type=media, headers={"Content-Disposition": content_disposition(filename)})


@router.get("/{run_id}/metrics.csv", summary="Every point of one metric type as CSV (step, epoch, time, name, value)")
def read_metrics_csv(
    run_id: str, type: MetricType, request: Request, user: CurrentUser, session: DbSession
) -> StreamingResponse:
    run = get_run(session, user, run_id)
    return download(request, run, type, "csv", f"{run.id}-{type}.csv")


@router.get("/{run_id}", summary="A run: metadata, hparams, platform, metric summary, lineage")
def read_run(run_id: str, user: CurrentUser, session: DbSession):
    run = get_run(session, user, run_id)
    return {
        "id": run.id,
        "name": run.name,
        "folder": session.scalar(select(Folder.path).where(Folder.id == run.folder_id)),
        "owner": session.scalar(select(User.name).where(User.id == run.owner_id)),
        "status": run.status,
        "start_time": run.start_time,
        "end_time": run.end_time,
        "labels": run.labels,
        "description": run.description,
        "hparams": run.hparams,
        "platform": run.platform,
        "meta": run.meta,
        "metrics": series.metric_counts(session, run.pk),
        "lineage": ingest.edges_of(session, run.id, user),
        "cursors": ingest.cursors(session, run.id),
        "shares": shares_of(session, "run", run.pk),
    }


@router.get("/{run_id}/metrics", summary="Every point of one metric type, as the local store writes them")
def read_metrics(
    run_id: str, type: MetricType, request: Request, user: CurrentUser, session: DbSession
) -> StreamingResponse:
    run = get_run(session, user, run_id)
    return download(request, run, type, "json", f"{run.id}-{type}.json")


@router.post("/{run_id}/metrics", summary="Append complete lines of metrics/<type>.jsonl (idempotent)")
def post_metrics(
    run_id: str,
    batch: MetricBatch,
    request: Request,
    user: CurrentUser,
    session: DbSession,
):
    run = get_run(session, user, run_id, Level.EDIT)
    limit = request.app.state.settings.max_batch_points
    return {"cursor": ingest.store_metrics(session, run.pk, run.id, batch, limit)}


@router.post("/{run_id}/log", summary="Append text of stdout.log from a byte offset (idempotent)")
def post_log(run_id: str, chunk: LogChunkIn, user: CurrentUser, session: DbSession):
    run = get_run(session, user, run_id, Level.EDIT)
    return {"cursor": ingest.store_log(session, run.pk, run.id, chunk.start, chunk.end, chunk.text)}


@router.get("/{run_id}/log", summary="The stdout.log text stored so far")
def read_log(
    run_id: str,
    user: CurrentUser,
    session: DbSession,
    offset: Annotated[int, Query(ge=0)] = 0,
):
    run = get_run(session, user, run_id)
    return {"text": ingest.read_log(session, run.pk, offset)}


@router.post("/{run_id}/lineage", summary="Append complete lines of the run's lineage.jsonl (idempotent)")
def post_lineage(run_id: str, batch: LineageBatch, user: CurrentUser, session: DbSession):
    run = get_run(session, user, run_id, Level.EDIT)
    return {"cursor": ingest.store_edges(session, run.id, batch.edges, batch.start, batch.end)}


@router.delete("/{run_id}", summary="Delete a run and its points")
def delete_run(run_id: str, user: CurrentUser, session: DbSession):
    run = get_run(session, user, run_id, Level.EDIT)
    session.execute(delete(Cursor).where(Cursor.node_id == run.id))
    drop_shares(session, "run", run.pk)
    session.delete(run)
    return {"id": run_id, "deleted": True}
