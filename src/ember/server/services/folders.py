"""Folders and sharing: a page of a folder as the caller sees it, and sharing a folder, run or artifact.

The service behind ``/api/v1/folders`` and ``/api/v1/shares`` (:mod:`ember.server.api.folder_routes`)
and the console's folder page. Plain functions over a session that raise
:mod:`ember.server.storage.domain_errors`; the rules of who may see and share what are
:mod:`ember.server.services.perms`'.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from ember.server.services import naming
from ember.server.services.folder_paging import folder_page
from ember.server.services.lookup import get_artifact, get_run
from ember.server.services.perms import PUBLIC, Level, get_folder, level, require, set_share, shares_of
from ember.server.storage.models import Artifact, Folder, Run, User


def folder_view(session: Session, user: User, path: str, limit: int, page_token: str | None) -> dict[str, Any]:
    """One page of a folder the caller may view: up to ``limit`` sub-folders, runs and artifacts.

    ``next_page_token`` continues whichever list is not finished (None when none is);
    ``access`` and ``shares`` (the latter to the owner only) come on every page.
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


def share(session: Session, user: User, kind: str, target: str, grantee: str, new_level: str) -> dict[str, Any]:
    """Grant ``view``/``edit`` on a folder, run or artifact the caller owns (or remove it with ``none``).

    A name that is no user gets the same answer as a user (no oracle of who exists); the grant
    is dropped if a user of that name is created later (:func:`ember.server.services.perms.forget_grantee`).
    """
    node: Folder | Run | Artifact
    if kind == "folder":
        node = get_folder(session, user, target)
        pk = node.id
    elif kind == "run":
        node = get_run(session, user, target)
        pk = node.pk
    else:
        node = get_artifact(session, user, target)
        pk = node.pk
    require(level(session, user, node), Level.OWN, f"{kind} {target}")
    who = grantee if grantee == PUBLIC else naming.user_name(grantee)
    set_share(session, kind, pk, who, new_level)
    return {"kind": kind, "target": target, "shares": shares_of(session, kind, pk)}
