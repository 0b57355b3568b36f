"""The console's run page, and what it fetches while open (a live run's refresh, the whole output)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from sqlalchemy import select

from ember._format import format_time
from ember.server import ingest, liveness
from ember.server.auth import DbSession
from ember.server.console import lineage
from ember.server.console.assets import VERSION
from ember.server.console.salvage import SKIPPED
from ember.server.console.session import PREFIX, require_viewer
from ember.server.console.views import ConsoleRoute, crumbs, render, secure
from ember.server.lookup import get_run
from ember.server.models import Artifact, ArtifactFile, Folder, User
from ember.server.perms import Level, level
from ember.server.series import metric_counts
from ember.server.wire import SafeJSONResponse

router = APIRouter(prefix=PREFIX, route_class=ConsoleRoute, include_in_schema=False)
TAIL_LINES = 200
MAX_HITS = 500
TYPE_ORDER = {"train": 0, "val": 1, "test": 2}


def _log_view(text: str, search: str) -> tuple[list[str], int, int]:
    """The last lines of a log, or the last :data:`MAX_HITS` lines matching ``search``; the number
    of lines, and of matching lines (0 without a search)."""
    lines = text.splitlines()
    if search:
        hits = [line for line in lines if search.lower() in line.lower()]
        return hits[-MAX_HITS:], len(lines), len(hits)
    return lines[-TAIL_LINES:], len(lines), 0


def _types(counts: list[dict[str, Any]]) -> list[str]:
    """A run's metric types: train, val, test, then the others by name."""
    return sorted({c["type"] for c in counts}, key=lambda t: (TYPE_ORDER.get(t, 3), t))


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


def _artifacts(session: Any, user: User, edges: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The artifacts linked to a run that the viewer may see, with their files."""
    ids = {end["id"] for e in edges for end in (e["source"], e["target"]) if end["kind"] == "artifact"}
    out = []
    for art in session.scalars(select(Artifact).where(Artifact.id.in_(ids)).order_by(Artifact.name)):
        if level(session, user, art) < Level.VIEW:
            continue
        files = session.scalars(select(ArtifactFile).where(ArtifactFile.artifact_pk == art.pk)).all()
        role = "output" if any(e["target"]["id"] == art.id for e in edges) else "input"
        out.append({"id": art.id, "name": art.name, "role": role, "files": sorted(files, key=lambda f: f.path)})
    return out


@router.get("/runs/{run_id}")
def run_page(
    run_id: str, request: Request, session: DbSession, log_q: Annotated[str, Query(max_length=200)] = ""
) -> Response:
    user = require_viewer(request, session)
    run = get_run(session, user, run_id)
    folder = session.scalar(select(Folder.path).where(Folder.id == run.folder_id)) or ""
    found = metric_counts(session, run.pk)  # from the block summaries
    edges = ingest.edges_of(session, run.id, user)
    log_lines, total_lines, hits = _log_view(ingest.read_log(session, run.pk), log_q)
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
        duration=liveness.duration_s(start, end),
        started=_when(start),
        ended=_when(run.end_time),
        last_record=_when(end) if status == "Crashed" else None,
        types=_types(found),
        system=system,
        packages=_packages(system),
        git=platform.get("git") or {},
        command=platform.get("command") or {},
        log_lines=log_lines,
        total_lines=total_lines,
        hits=hits,
        max_hits=MAX_HITS,
        log_q=log_q,
        artifacts=_artifacts(session, user, edges),
        graph=lineage.graph("run", run.id, run.name, edges),
    )


@router.get("/runs/{run_id}/live")
def run_live(run_id: str, request: Request, session: DbSession) -> Response:
    """What a live run page refreshes: the status, the metric types, the output's last lines."""
    user = require_viewer(request, session)
    run = get_run(session, user, run_id)
    lines, total, _ = _log_view(ingest.read_log(session, run.pk), "")
    body = {
        "status": liveness.shown_status(run.status, run.meta),
        "types": _types(metric_counts(session, run.pk)),
        "lines": lines,
        "total_lines": total,
    }
    response = SafeJSONResponse(body)
    secure(response)
    return response


@router.get("/runs/{run_id}/output.log")
def run_log(run_id: str, request: Request, session: DbSession) -> Response:
    """The run's whole output (stdout.log), as a download."""
    user = require_viewer(request, session)
    run = get_run(session, user, run_id)
    response = Response(ingest.read_log(session, run.pk), media_type="text/plain; charset=utf-8")
    response.headers["Content-Disposition"] = f'attachment; filename="{run.id}.log"'
    secure(response)
    return response
