"""The console's run page, and what it fetches while open (a live run's refresh, the whole output).

The output section reads a bounded window of the run's output (:mod:`ember.server.services.logs`),
whatever its size: the last lines, the lines from ``log_from`` (earlier/later links), or the
lines holding ``log_q``, searched backwards a bounded stretch at a time (``log_before`` goes on).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from ember._format import format_time
from ember.server.api.auth import DbSession
from ember.server.api.wire import LineageDepth, SafeJSONResponse
from ember.server.console.assets import VERSION
from ember.server.console.lineage_pages import graph_of
from ember.server.console.session import PREFIX, require_viewer
from ember.server.console.views import ConsoleRoute, crumbs, render, secure
from ember.server.services import edges, liveness, logs
from ember.server.services.lookup import get_run
from ember.server.services.perms import Level, level
from ember.server.services.runs import SKIPPED
from ember.server.services.series import metric_counts
from ember.server.storage.models import Artifact, ArtifactFile, Folder, User
from ember.track.best import metric_mode, recorded_modes
from ember.track.hparams import flatten

router = APIRouter(prefix=PREFIX, route_class=ConsoleRoute, include_in_schema=False)
TYPE_ORDER = {"train": 0, "val": 1, "test": 2}
LineNumber = Annotated[int | None, Query(ge=0, le=2**62)]


def _output(session: Session, run_pk: int, search: str, start: int | None, before: int | None) -> dict[str, Any]:
    """What the output section shows: the tail, a window of lines from line ``start`` (1-based), or the
    lines holding ``search`` before line ``before`` (0-based: where the last search stopped)."""
    if search:
        found = logs.search(session, run_pk, search, before)
        return {
            "mode": "search",
            "lines": [line for _, line in found.hits],
            "total": found.total,
            "hits": found.count,
            "searched_from": found.searched_from,
            "until": found.until,
        }
    view = logs.window(session, run_pk, start - 1, logs.TAIL_LINES) if start else logs.tail(session, run_pk)
    shown_to = view.first + len(view.lines)
    return {
        "mode": "window" if shown_to < view.total else "tail",
        "lines": view.lines,
        "total": view.total,
        "first": view.first + 1,
        "last": shown_to,
        "cut": view.cut,
        "earlier": max(1, view.first + 1 - logs.TAIL_LINES) if view.first > 0 else None,
        "later": shown_to + 1 if shown_to < view.total else None,
    }


def _types(counts: list[dict[str, Any]]) -> list[str]:
    """A run's metric types: train, val, test, then the others by name."""
    return sorted({c["type"] for c in counts}, key=lambda t: (TYPE_ORDER.get(t, 3), t))


def _modes(meta: Any, counts: list[dict[str, Any]]) -> dict[str, str]:
    """Each metric's mode (``min``/``max``: the run's recorded one, else the name rule): the page's log
    scale draws only the minimised ones on a log axis (never an accuracy)."""
    recorded = recorded_modes(meta)
    keys = (f"{c['type']}/{c['name']}" for c in counts)
    return {k: metric_mode(k, recorded.get(k)) for k in keys}


def _when(value: str | None) -> dict[str, str] | None:
    """An ISO time as shown: its text with its time zone (:func:`ember._format.format_time`)."""
    return {"iso": value, "text": format_time(value)} if value else None


def _packages(system: Any) -> list[tuple[str, str]] | None:
    """The installed packages of a platform record, sorted by name; None when it has none (an old
    run) or they are not a name -> version mapping (a damaged record). Odd values show as text."""
    packages = system.get("packages") if isinstance(system, dict) else None
    if not isinstance(packages, dict) or not packages:
        return None
    return sorted(((str(k), "" if v is None else str(v)) for k, v in packages.items()), key=lambda p: p[0].lower())


def _artifacts(session: Any, user: User, lineage: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The artifacts linked to a run that the viewer may see, with their files."""
    ids = {end["id"] for e in lineage for end in (e["source"], e["target"]) if end["kind"] == "artifact"}
    out = []
    for art in session.scalars(select(Artifact).where(Artifact.id.in_(ids)).order_by(Artifact.name)):
        if level(session, user, art) < Level.VIEW:
            continue
        files = session.scalars(select(ArtifactFile).where(ArtifactFile.artifact_pk == art.pk)).all()
        output = any(e["target"]["kind"] == "artifact" and e["target"]["id"] == art.id for e in lineage)
        role = "output" if output else "input"
        out.append({"id": art.id, "name": art.name, "role": role, "files": sorted(files, key=lambda f: f.path)})
    return out


@router.get("/runs/{run_id}")
def run_page(
    run_id: str,
    request: Request,
    session: DbSession,
    log_q: Annotated[str, Query(max_length=200)] = "",
    log_from: LineNumber = None,
    log_before: LineNumber = None,
    lineage_depth: LineageDepth = "1",
) -> Response:
    user = require_viewer(request, session)
    run = get_run(session, user, run_id)
    folder = session.scalar(select(Folder.path).where(Folder.id == run.folder_id)) or ""
    found = metric_counts(session, run.pk)  # from the block summaries
    lineage = edges.edges_of(session, "run", run.id, run.name, user, edges.parse_depth(lineage_depth))
    platform = run.platform if isinstance(run.platform, dict) else {}
    system = platform.get("platform") if isinstance(platform.get("platform"), dict) else {}
    status = liveness.shown_status(run.status, run.meta)
    start = run.start_time if isinstance(run.start_time, str) else None
    if status == "Crashed":  # no end time: it lasted until its last record, as the runs table says
        end = liveness.last_records(session, {run.pk: (start, run.meta.get("heartbeat"))})[run.pk]
    else:
        end = run.end_time
    return render(
        request,
        "run.html",
        asset_v=VERSION,
        user=user,
        run=run,
        folder=folder,
        crumbs=crumbs(folder),
        owner=session.scalar(select(User.name).where(User.id == run.owner_id)),
        status=status,
        reason=run.meta.get("reason") if isinstance(run.meta.get("reason"), str) else None,
        skipped=[str(n) for n in run.meta.get(SKIPPED) or [] if isinstance(run.meta.get(SKIPPED), list)],
        duration=liveness.duration_s(start, end, status == "Running"),
        started=_when(start),
        ended=_when(run.end_time),
        last_record=_when(end) if status == "Crashed" else None,
        types=_types(found),
        modes=_modes(run.meta, found),
        hparams=flatten(run.hparams) if isinstance(run.hparams, dict) else {},
        system=system,
        packages=_packages(system),
        git=platform.get("git") or {},
        command=platform.get("command") or {},
        output=_output(session, run.pk, log_q, log_from, log_before),
        max_hits=logs.MAX_HITS,
        log_q=log_q,
        artifacts=_artifacts(session, user, edges.touching(lineage, "run", run.id)),
        graph=graph_of("run", run.id, run.name, lineage),
        can_edit=level(session, user, run) >= Level.EDIT,
    )


@router.get("/runs/{run_id}/live")
def run_live(run_id: str, request: Request, session: DbSession) -> Response:
    """What a live run page refreshes: the status, the metric types, the output's last lines (a bounded read)."""
    user = require_viewer(request, session)
    run = get_run(session, user, run_id)
    tail = logs.tail(session, run.pk)
    body = {
        "status": liveness.shown_status(run.status, run.meta),
        "types": _types(metric_counts(session, run.pk)),
        "lines": tail.lines,
        "total_lines": tail.total,
    }
    response = SafeJSONResponse(body)
    secure(response)
    return response


@router.get("/runs/{run_id}/output.log")
def run_log(run_id: str, request: Request, session: DbSession) -> Response:
    """The run's whole output (stdout.log), as a download streamed a few pieces at a time."""
    user = require_viewer(request, session)
    run = get_run(session, user, run_id)
    body = logs.stream(request.app.state.read_sessions, run.pk)
    response = StreamingResponse(body, media_type="text/plain; charset=utf-8")
    response.headers["Content-Disposition"] = f'attachment; filename="{run.id}.log"'
    secure(response)
    return response
