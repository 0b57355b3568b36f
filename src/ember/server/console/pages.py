"""Console pages: login and logout, the folder browser (with sharing), the runs table."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy import func, select

from ember.server.api.auth import DbSession
from ember.server.api.run_search import RunSearchQuery
from ember.server.console.session import (
    PREFIX,
    check_csrf,
    end_session,
    require_viewer,
    safe_next,
    start_session,
    viewer,
)
from ember.server.console.views import ConsoleRoute, crumbs, render, secure
from ember.server.services import folders, grouping, listing
from ember.server.services.perms import get_folder
from ember.server.storage.domain_errors import Invalid
from ember.server.storage.models import Folder, Run

router = APIRouter(prefix=PREFIX, route_class=ConsoleRoute, include_in_schema=False)
STATUSES = ("Running", "Crashed", "Complete", "Failed", "Interrupted", "Preempted", "Damaged")


@router.get("/login")
def login_page(request: Request, session: DbSession, next: str | None = None) -> Response:
    if request.app.state.console_local_user is not None or viewer(request, session) is not None:
        return RedirectResponse(safe_next(next), status_code=303)
    return render(request, "login.html", next=safe_next(next), error=None)


@router.post("/login")
def login(
    request: Request,
    session: DbSession,
    api_key: Annotated[str, Form(max_length=200)],
    csrf: Annotated[str, Form(max_length=200)] = "",
    next: Annotated[str, Form(max_length=2000)] = "",
) -> Response:
    check_csrf(request, csrf)
    response = RedirectResponse(safe_next(next), status_code=303)
    if start_session(request, response, session, api_key) is None:
        error = "That API key is unknown, revoked or expired."
        return render(request, "login.html", status_code=401, next=safe_next(next), error=error)
    secure(response)
    return response


@router.post("/logout")
def logout(request: Request, session: DbSession, csrf: Annotated[str, Form(max_length=200)] = "") -> Response:
    check_csrf(request, csrf)
    response = RedirectResponse(f"{PREFIX}/login", status_code=303)
    end_session(request, response, session)
    secure(response)
    return response


@router.get("/")
def home(request: Request, session: DbSession) -> Response:
    user = require_viewer(request, session)
    return RedirectResponse(f"{PREFIX}/folders?path=/{user.name}", status_code=303)


@router.get("/folders")
def folder_page(
    request: Request,
    session: DbSession,
    path: Annotated[str | None, Query(max_length=1024)] = None,
    page_token: Annotated[str | None, Query(max_length=2000)] = None,
    per_page: Annotated[int, Query(ge=1, le=500)] = 50,
    sort: Annotated[str, Query(max_length=300)] = "-start",
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
) -> Response:
    """A folder a page at a time, from ``GET /api/v1/folders``'s pages: "next page" follows its token.

    Its runs come newest first, a page per token; sorted by a header (``sort``, as the runs table
    sorts: ``-m:val/acc.best``...), the folder's own runs (not its sub-folders') come from
    :func:`ember.server.services.listing.list_runs`, numbered pages (``page``)."""
    user = require_viewer(request, session)
    if not path or path == "/":
        return _roots(request, session, user)
    found = folders.folder_view(session, user, path, per_page, page_token)
    if sort != "-start":
        runs = listing.list_runs(
            session, user, folder=found["path"], beneath=False, sort=sort, page=page, per_page=per_page
        )
    else:
        folder_id = session.scalar(select(Folder.id).where(Folder.path == found["path"]))
        where = (Run.folder_id == folder_id, Run.deleted.is_(None))
        total = session.scalar(select(func.count()).select_from(Run).where(*where)) or 0
        runs = listing.table_of(session, [r["id"] for r in found["runs"]], total, per_page)
    token = found["next_page_token"]
    keep = {"path": found["path"], **({"per_page": per_page} if per_page != 50 else {})}
    keep_sorted = {**keep, **({"sort": sort} if sort != "-start" else {})}
    return render(
        request,
        "folder.html",
        user=user,
        folder=found,
        crumbs=crumbs(found["path"]),
        runs=runs,
        found=runs,
        sortable=True,
        sort_page="folders",
        columns_key=found["path"],
        params=keep,
        sort=sort,
        run_pages=max(1, -(-runs.total // runs.per_page)) if sort != "-start" else 0,
        children=[(p.rsplit("/", 1)[-1], p) for p in found["folders"]],
        own=found["access"] == "own",
        next_page=f"{PREFIX}/folders?{urlencode({**keep_sorted, 'page_token': token})}" if token else None,
        first_page=f"{PREFIX}/folders?{urlencode(keep_sorted)}" if page_token else None,
    )


def _roots(request: Request, session: Any, user: Any) -> Response:
    """'/': your home, and the highest folders shared with you."""
    visible = listing.visible_folder_ids(session, user)
    rows = session.execute(select(Folder.id, Folder.path, Folder.parent_id).where(Folder.id.in_(visible))).all()
    tops = sorted(p for _, p, parent in rows if parent not in visible)
    return render(request, "roots.html", user=user, tops=tops, crumbs=[])


@router.post("/shares")
def share_form(
    request: Request,
    session: DbSession,
    path: Annotated[str, Form(max_length=1024)],
    grantee: Annotated[str, Form(max_length=64)],
    access: Annotated[str, Form(pattern="^(view|edit|none)$")],
    csrf: Annotated[str, Form(max_length=200)] = "",
) -> Response:
    check_csrf(request, csrf)
    user = require_viewer(request, session)
    folder = get_folder(session, user, path)
    folders.share(session, user, "folder", folder.path, grantee.strip(), access)
    return RedirectResponse(f"{PREFIX}/folders?path={folder.path}", status_code=303)


@router.get("/runs")
def runs_page(
    request: Request,
    session: DbSession,
    query: RunSearchQuery,
    where: Annotated[str, Query(max_length=2000)] = "",
    group: Annotated[str, Query(max_length=400)] = "",
) -> Response:
    user = require_viewer(request, session)
    path = query.path(user)
    errors: list[str] = []
    error_at = 0  # the column of a filter error, 1-based
    if group.strip():  # grouped: the first grouping.MAX_RUNS runs in the table's order, on one page
        query = replace(query, page=1, per_page=grouping.MAX_RUNS)
    try:
        found = query.runs(session, user, [where])
    except Invalid as e:  # a filter or sort not understood: said beside the field, the form kept
        errors.append(e.detail)
        error_at = next((int(x["column"]) for x in e.errors if x.get("field") == "filter"), 0)
        found = listing.RunPage(0, 1, query.per_page, [], [], [], [], [], {})
    q, label, status = query.q, query.label, query.status
    if (where.strip() or q or label or status) and not errors and found.total == 0:
        errors += listing.why_no_runs(session, user, path, [where], q, label, status)
    groups = _groups(found, group, errors)
    given = {"folder": query.folder, "q": q, "label": label, "status": status, "where": where, "group": group.strip()}
    params: dict[str, object] = {k: v for k, v in given.items() if v}
    if query.per_page != 50 and not groups:
        params["per_page"] = query.per_page
    pages = max(1, -(-found.total // found.per_page))
    return render(
        request,
        "runs.html",
        user=user,
        found=found,
        params=params,
        sort=query.sort,
        pages=pages,
        statuses=STATUSES,
        sortable=True,
        crumbs=crumbs(path) if path else [],
        errors=errors,
        error_at=error_at,
        columns_key=path or "",
        groups=groups,
    )


def _groups(found: listing.RunPage, text: str, errors: list[str]) -> list[grouping.Group] | None:
    """The table's runs grouped by ``?group=`` (None when not grouped, or when a key is wrong: said in ``errors``)."""
    if not text.strip() or not found.runs:
        return None
    try:
        keys = grouping.parse_keys(text, found.hparam_choices)
    except Invalid as e:
        errors.append(e.detail)
        return None
    return grouping.group_runs(found.runs, keys, found.metric_choices) if keys else None
