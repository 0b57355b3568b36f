"""Console forms that change runs: rename, labels and notes on the run page; labels and the trash
for the runs ticked in the runs table; the trash page (restore, delete now).

Each is a POST with the page's CSRF token that calls one service of :mod:`ember.server.services.runs`,
which checks edit rights on each run (403 for view-only, 404 for a run you cannot see), and
answers with a redirect back.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from ember.server.api.auth import DbSession
from ember.server.console.session import PREFIX, check_csrf, require_viewer, safe_next
from ember.server.console.views import ConsoleRoute, render
from ember.server.services import runs
from ember.server.services.lookup import get_run
from ember.server.storage.domain_errors import Invalid
from ember.server.storage.schemas import RunEdit

router = APIRouter(prefix=PREFIX, route_class=ConsoleRoute, include_in_schema=False)
Csrf = Annotated[str, Form(max_length=200)]


def _labels(text: str) -> list[str]:
    """Labels typed into one box, separated by commas."""
    return [part for part in (p.strip() for p in text.split(",")) if part]


@router.post("/runs/{run_id}/edit")
def edit_form(
    run_id: str,
    request: Request,
    session: DbSession,
    name: Annotated[str, Form(max_length=100)],
    labels: Annotated[str, Form(max_length=200_000)] = "",
    description: Annotated[str, Form(max_length=100_000)] = "",
    csrf: Csrf = "",
) -> Response:
    check_csrf(request, csrf)
    user = require_viewer(request, session)
    runs.edit_run(session, user, run_id, RunEdit(name=name, labels=_labels(labels), description=description))
    return RedirectResponse(f"{PREFIX}/runs/{run_id}", status_code=303)


@router.post("/runs/{run_id}/trash")
def trash_form(run_id: str, request: Request, session: DbSession, csrf: Csrf = "") -> Response:
    check_csrf(request, csrf)
    user = require_viewer(request, session)
    runs.trash_run(session, user, run_id)
    return RedirectResponse(f"{PREFIX}/trash", status_code=303)


@router.post("/runs-bulk")
def bulk_form(
    request: Request,
    session: DbSession,
    action: Annotated[str, Form(pattern="^(label|unlabel|trash)$")],
    ids: Annotated[list[str], Form(max_length=500)],
    label: Annotated[str, Form(max_length=100)] = "",
    back: Annotated[str, Form(max_length=4000)] = "",
    csrf: Csrf = "",
) -> Response:
    """Add or remove one label on every run ticked, or move them all to the trash (each run's rights
    checked; the first refusal undoes the whole request)."""
    check_csrf(request, csrf)
    user = require_viewer(request, session)
    if action != "trash" and not label.strip():
        raise Invalid.field("label", "type the label to add or remove")
    for run_id in ids:
        if action == "trash":
            runs.trash_run(session, user, run_id)
            continue
        held = get_run(session, user, run_id).labels
        changed = [*held, label.strip()] if action == "label" else [x for x in held if x != label.strip()]
        runs.edit_run(session, user, run_id, RunEdit(labels=changed))
    return RedirectResponse(safe_next(back) if back else f"{PREFIX}/runs", status_code=303)


@router.get("/trash")
def trash_page(request: Request, session: DbSession) -> Response:
    user = require_viewer(request, session)
    return render(request, "trash.html", user=user, trashed=runs.trash_of(session, user), days=runs.TRASH_DAYS)


@router.post("/trash/{run_id}/restore")
def restore_form(run_id: str, request: Request, session: DbSession, csrf: Csrf = "") -> Response:
    check_csrf(request, csrf)
    runs.restore_run(session, require_viewer(request, session), run_id)
    return RedirectResponse(f"{PREFIX}/runs/{run_id}", status_code=303)


@router.post("/trash/{run_id}/purge")
def purge_form(run_id: str, request: Request, session: DbSession, csrf: Csrf = "") -> Response:
    check_csrf(request, csrf)
    runs.delete_run(session, require_viewer(request, session), run_id)
    return RedirectResponse(f"{PREFIX}/trash", status_code=303)
