"""``/api/v1/me``, ``/keys``, ``/users``, ``/folders`` and ``/shares``: who, keys, the folder tree, sharing."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from ember.server.api.auth import CallerKey, CurrentUser, DbSession
from ember.server.api.wire import CheckedRoute
from ember.server.services import accounts, folders
from ember.server.services.folder_paging import MAX_LIMIT
from ember.server.services.perms import ensure_folder
from ember.server.storage.schemas import FolderIn, KeyIn, ShareIn, UserIn

router = APIRouter(tags=["users and folders"], route_class=CheckedRoute)


@router.get("/me", summary="The caller: name, admin flag, home folder")
def me(user: CurrentUser):
    return {"name": user.name, "is_admin": user.is_admin, "home": f"/{user.name}"}


@router.get("/keys", summary="The caller's API keys (ids and labels, never the keys)")
def list_keys(user: CurrentUser, session: DbSession):
    return {"keys": accounts.list_keys(session, user)}


@router.post("/keys", summary="Create an API key for the caller; the key is in this answer only")
def create_key(body: KeyIn, user: CurrentUser, key: CallerKey, session: DbSession):
    """The new key expires no later than the key this request came with, and is revoked with it."""
    return accounts.create_key(session, user, body.label, body.expires_days, key)


@router.delete("/keys/{key_id}", summary="Revoke one of the caller's keys and those made with it (an admin: any)")
def revoke_key(key_id: str, user: CurrentUser, session: DbSession):
    return accounts.revoke_key(session, user, key_id)


@router.post("/users", summary="Create a user and its first key (admins only)")
def create_user(body: UserIn, user: CurrentUser, key: CallerKey, session: DbSession):
    """The first key expires no later than the admin's key this request came with, and is revoked with it."""
    return accounts.create_user(session, user, body.name, body.admin, key)


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
    return folders.folder_view(session, user, path, limit, page_token)


@router.post("/folders", summary="Create a folder in an existing one (and missing parents with parents=true)")
def create_folder(body: FolderIn, user: CurrentUser, session: DbSession, request: Request):
    limit = request.app.state.settings.max_user_folders  # 413 past it (--max-user-folders)
    folder = ensure_folder(session, user, body.path, make=True, parents=body.parents, max_folders=limit)
    return {"path": folder.path}


@router.put("/shares", summary="Share a folder, run or artifact with a user or everyone ('*'), or stop")
def share(body: ShareIn, user: CurrentUser, session: DbSession):
    return folders.share(session, user, body.kind, body.target, body.grantee, body.level)
