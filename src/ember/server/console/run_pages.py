"""Console pages of one node: the run page and the artifact page."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from sqlalchemy import select

from ember.server import ingest, listing
from ember.server.auth import DbSession
from ember.server.console import lineage
from ember.server.console.pages import crumbs
from ember.server.console.salvage import SKIPPED
from ember.server.console.session import PREFIX, require_viewer
from ember.server.console.views import ConsoleRoute, render
from ember.server.models import Artifact, ArtifactFile, Folder, User
from ember.server.perms import Level, level
from ember.server.routes_artifacts import get_artifact
from ember.server.routes_runs import get_run
from ember.server.series import metric_counts

router = APIRouter(prefix=PREFIX, route_class=ConsoleRoute, include_in_schema=False)
TAIL_LINES = 200


def _log_view(text: str, search: str) -> tuple[list[str], int]:
    """The last lines of a log, or the lines matching ``search``; and the number of lines."""
    lines = text.splitlines()
    if search:
        hits = [line for line in lines if search.lower() in line.lower()]
        return hits[-500:], len(lines)
    return lines[-TAIL_LINES:], len(lines)


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
    counts = [(m["type"], m["name"], m["count"]) for m in metric_counts(session, run.pk)]  # block summaries
    order = {"train": 0, "val": 1, "test": 2}
    types = sorted({t for t, _, _ in counts}, key=lambda t: (order.get(t, 3), t))
    edges = ingest.edges_of(session, run.id, user)
    log_lines, total_lines = _log_view(ingest.read_log(session, run.pk), log_q)
    platform = run.platform or {}
    status = listing.shown_status(run.status, run.meta)
    return render(
        request,
        "run.html",
        user=user,
        run=run,
        folder=folder,
        crumbs=crumbs(folder),
        owner=session.scalar(select(User.name).where(User.id == run.owner_id)),
        status=status,
        reason=run.meta.get("reason") if isinstance(run.meta.get("reason"), str) else None,
        skipped=[str(n) for n in run.meta.get(SKIPPED) or [] if isinstance(run.meta.get(SKIPPED), list)],
        duration=listing.duration_s(run.start_time, run.meta.get("heartbeat") if status == "Crashed" else run.end_time),
        types=types,
        counts={f"{t}/{n}": c for t, n, c in counts},
        summary=listing.metric_summary(session, [run.pk]).get(run.pk, {}),
        system=platform.get("platform", {}),
        git=platform.get("git") or {},
        command=platform.get("command") or {},
        log_lines=log_lines,
        total_lines=total_lines,
        log_q=log_q,
        artifacts=_artifacts(session, user, edges),
        graph=lineage.graph("run", run.id, run.name, edges),
    )


@router.get("/artifacts/{artifact_id}")
def artifact_page(artifact_id: str, request: Request, session: DbSession) -> Response:
    user = require_viewer(request, session)
    art = get_artifact(session, user, artifact_id)
    folder = session.scalar(select(Folder.path).where(Folder.id == art.folder_id)) or ""
    files = session.scalars(
        select(ArtifactFile).where(ArtifactFile.artifact_pk == art.pk).order_by(ArtifactFile.path)
    ).all()
    edges = ingest.edges_of(session, art.id, user)
    return render(
        request,
        "artifact.html",
        user=user,
        art=art,
        folder=folder,
        crumbs=crumbs(folder),
        files=files,
        total=sum(f.size for f in files),
        graph=lineage.graph("artifact", art.id, art.name, edges),
    )
