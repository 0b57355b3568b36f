"""``/api/v1/me``, ``/keys``, ``/users``, ``/folders`` and ``/shares``: who, keys, the folder tree, sharing."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from sqlalchemy import select

from ember.server import naming
from ember.server.auth import CurrentUser, DbSession, new_key, now
from ember.server.folder_pages import MAX_LIMIT, folder_page
from ember.server.models import ApiKey, Artifact, Folder, Run, User
from ember.server.perms import (
    PUBLIC,
    Level,
    ensure_folder,
    forget_grantee,
    get_folder,
    level,
    make_home,
    require,
    set_share,
    shares_of,
)
from ember.server.routes_artifacts import get_artifact
from ember.server.routes_runs import get_run
from ember.server.schemas import FolderIn, KeyIn, ShareIn, UserIn
from ember.server.wire import CheckedRoute

router = APIRouter(tags=["users and folders"], route_class=CheckedRoute)


@router.get("/me", summary="The caller: name, admin flag, home folder")
def me(user: CurrentUser):
    return {"name": user.name, "is_admin": user.is_admin, "home": f"/{user.name}"}


@router.get("/keys", summary="The caller's API keys (ids and labels, never the keys)")
def list_keys(user: CurrentUser, session: DbSession):
    rows = session.scalars(select(ApiKey).where(ApiKey.user_id == user.id).order_by(ApiKey.id)).all()
    return {
        "keys": [
            {"key_id": k.key_id, "label": k.label, "created": k.created, "expires": k.expires, "revoked": k.revoked}
            for k in rows
        ]
    }


@router.post("/keys", summary="Create an API key for the caller; the key is in this answer only")
def create_key(body: KeyIn, user: CurrentUser, session: DbSession):
    expires = now() + timedelta(days=body.expires_days) if body.expires_days else None
    key = new_key(session, user, body.label, expires)
    return {"key": key, "expires": expires}


@router.delete("/keys/{key_id}", summary="Revoke one of the caller's keys (an admin may revoke any)")
def revoke_key(key_id: str, user: CurrentUser, session: DbSession):
    row = session.scalar(select(ApiKey).where(ApiKey.key_id == key_id))
    if row is None or (row.user_id != user.id and not user.is_admin):
        raise HTTPException(404, f"no key {key_id!r} of yours")
    row.revoked = row.revoked or now()
    return {"key_id": key_id, "revoked": True}


@router.post("/users", summary="Create a user and its first key (admins only)")
def create_user(body: UserIn, user: CurrentUser, session: DbSession):
    if not user.is_admin:
        raise HTTPException(403, "only an admin may create users")
    name = naming.user_name(body.name)
    if session.scalar(select(User).where(User.name == name)) is not None:
        raise HTTPException(409, f"user {name!r} exists already")
    created = User(name=name, is_admin=body.admin, created=now())
    session.add(created)
    session.flush()
    forget_grantee(session, name)
    make_home(session, created)
    return {"name": name, "key": new_key(session, created, "first key")}


@router.get("/folders", summary="A folder: a page of its sub-folders, runs and artifacts the caller may see")
def read_folder(
    path: Annotated[str, Query(max_length=1024)],
    user: CurrentUser,
    session: DbSession,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="the most sub-folders, runs and artifacts")] = 100,
    page_token: Annotated[str | None, Query(max_length=2000, description="next_page_token of the page before")] = None,
):
    """One page: up to ``limit`` sub-folders (by path), runs (newest first) and artifacts (by name).

    ``next_page_token`` continues whichever list is not finished (null when none is); pass it
    back as ``page_token`` with the same ``path``. ``access`` and ``shares`` come on every page.
    """
    folder = get_folder(session, user, path)
    page = folder_page(session, folder, limit, page_token)
    mine = level(session, user, folder)
    return {
        "path": folder.path,
        "access": mine.name.lower(),
        "folders": page.folders,
        "runs": [{k: v for k, v in r.items() if k != "pk"} for r in page.runs],
        "artifacts": page.artifacts,
        "shares": shares_of(session, "folder", folder.id) if mine == Level.OWN else [],
        "next_page_token": page.next_page_token,
    }


@router.post("/folders", summary="Create a folder in an existing one (and missing parents with parents=true)")
def create_folder(body: FolderIn, user: CurrentUser, session: DbSession):
    folder = ensure_folder(session, user, body.path, make=True, parents=body.parents)
    return {"path": folder.path}


@router.put("/shares", summary="Share a folder, run or artifact with a user or everyone ('*'), or stop")
def share(body: ShareIn, user: CurrentUser, session: DbSession):
    node: Folder | Run | Artifact
    if body.kind == "folder":
        node = get_folder(session, user, body.target)
        pk = node.id
    elif body.kind == "run":
        node = get_run(session, user, body.target)
        pk = node.pk
    else:
        node = get_artifact(session, user, body.target)
        pk = node.pk
    require(level(session, user, node), Level.OWN, f"{body.kind} {body.target}")
    # A name that is no user gets the same answer as a user (no oracle of who exists); the grant
    # is dropped if a user of that name is created later (perms.forget_grantee).
    grantee = body.grantee if body.grantee == PUBLIC else naming.user_name(body.grantee)
    set_share(session, body.kind, pk, grantee, body.level)
    return {"kind": body.kind, "target": body.target, "shares": shares_of(session, body.kind, pk)}
