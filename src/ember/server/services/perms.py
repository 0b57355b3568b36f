"""Folders and permissions: each user's home, sharing as view or edit, inherited downwards.

A folder tree has one owner: a user owns their home ``/<user>`` and everything beneath it,
whoever created it (an editor who makes a sub-folder in a folder shared with them does not own
it). A share grants ``view`` or ``edit`` on a folder, run or artifact to one user or to everyone
with a key (grantee ``*``) and applies to everything beneath a shared folder. The strongest
grant along the path wins. Removing a grantee's share of a folder removes their grants beneath
it too, so a revocation covers the whole subtree. Without ``view`` a node does not exist for the
caller (404); with ``view`` but not ``edit`` a change is refused (403).

**The lock order.** A write that checks a limit of the owner of a tree (its runs, its folders,
its storage quota) counts after locking that owner's ``users`` row (:func:`lock_owner`), so
requests sent at once take turns on PostgreSQL (SQLite runs one writer at a time already). To
never deadlock, every write road takes its locks in one order, each step only after the ones
before it:

0. the id of a node it creates (``lookup.claim_id``, PostgreSQL advisory locks, ids sorted);
1. the owner's ``users`` row: :func:`ensure_folder` takes it as soon as it knows the folder to
   write into, the roads of an existing run or artifact take it before anything else
   (``blobs.hold``), a blob upload takes the uploader's; one owner per transaction;
2. the blob lock (``blobs.lock``), by the roads that record, list or collect blobs;
3. the node's rows: its cursor (``ingest.lock_cursor``), then its ``runs`` or ``artifacts``
   row, then the rows beneath it (points, output, images, files).

A road may skip a step, never go back to an earlier one. Roads that only take bytes away (a run
deleted, a blob collected) need no owner lock and keep steps 2 and 3 in this order.
"""

from __future__ import annotations

from enum import IntEnum

from sqlalchemy import delete, func, or_, select, tuple_
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ember.server.services import naming
from ember.server.storage.domain_errors import Forbidden, NotFound, TooLarge
from ember.server.storage.models import Artifact, Folder, Run, Share, User, now

PUBLIC = "*"
MAX_GRANTS = 1_000
"""Grants one folder, run or artifact may carry (grants to names that are no user count too)."""


class Level(IntEnum):
    """What a user may do with a node."""

    NONE = 0
    VIEW = 1
    EDIT = 2
    OWN = 3


def ancestors(path: str) -> list[str]:
    """'/a/b/c' -> ['/a/b/c', '/a/b', '/a']."""
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(len(parts), 0, -1)]


def home_of(path: str) -> str:
    """The user name whose home a folder path lies in: '/alice/a/b' -> 'alice'."""
    return path.split("/", 2)[1]


def in_tree(path: str, root: str) -> bool:
    """Whether folder ``path`` is ``root`` or beneath it."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def level(session: Session, user: User, node: Folder | Run | Artifact, folder: Folder | None = None) -> Level:
    """The caller's level on a folder, run or artifact (``folder``: the run/artifact's folder)."""
    if isinstance(node, Folder):
        folder, kind, node_pk = node, "folder", node.id
    else:
        if folder is None:
            folder = session.get(Folder, node.folder_id)
            assert folder is not None
        kind, node_pk = ("run", node.pk) if isinstance(node, Run) else ("artifact", node.pk)
    if home_of(folder.path) == user.name:
        return Level.OWN
    chain = session.scalars(select(Folder.id).where(Folder.path.in_(ancestors(folder.path)))).all()
    keys = [("folder", fid) for fid in chain]
    if kind != "folder":
        keys.append((kind, node_pk))
    grants = session.scalars(
        select(Share.level).where(
            tuple_(Share.node_kind, Share.node_id).in_(keys), or_(Share.grantee == user.name, Share.grantee == PUBLIC)
        )
    ).all()
    return max((Level.EDIT if g == "edit" else Level.VIEW for g in grants), default=Level.NONE)


def require(found: Level, needed: Level, what: str) -> None:
    """404 when the caller may not see ``what``; 403 when they see it but may not do this."""
    if found >= needed:
        return
    if found == Level.NONE:
        raise NotFound(f"{what} does not exist or is not shared with you")
    verb = {Level.EDIT: "change", Level.OWN: "share or delete"}.get(needed, "read")
    raise Forbidden(f"you may view {what} but not {verb} it: ask its owner for {needed.name.lower()} access")


def get_folder(session: Session, user: User, path: str, needed: Level = Level.VIEW) -> Folder:
    """The folder at an absolute or home-relative path, if the caller has ``needed`` on it."""
    path = naming.folder_path(path, home=f"/{user.name}")
    folder = session.scalar(select(Folder).where(Folder.path == path))
    if folder is None:
        raise NotFound(f"folder {path!r} does not exist or is not shared with you")
    require(level(session, user, folder), needed, f"folder {path!r}")
    return folder


def lock_owner(session: Session, owner_id: int) -> None:
    """Lock the owner's ``users`` row until the transaction ends (step 1 of the lock order above).

    ``FOR NO KEY UPDATE`` on PostgreSQL: it waits for another request holding the owner, not for
    rows being inserted that refer to the user (a foreign key takes only a key-share lock);
    SQLite ignores it (one writer at a time already).
    """
    session.execute(select(User.id).where(User.id == owner_id).with_for_update(key_share=True))


def check_owned(session: Session, kind: type[Folder | Run], owner_id: int, adding: int, limit: int | None) -> None:
    """413 when ``adding`` more folders or runs take the tree of ``owner_id`` past ``limit`` (None: no limit).

    One count over the owner's index range (``ix_folders_owner_id``, ``ix_runs_owner_id``), which
    the limit itself bounds, after locking the owner's row until the transaction ends: on
    PostgreSQL two requests that counted at once would each have seen room for their own run
    (SQLite runs one writer at a time already, and ignores the lock).
    """
    if limit is None or adding <= 0:
        return
    lock_owner(session, owner_id)
    held = int(session.scalar(select(func.count()).select_from(kind).where(kind.owner_id == owner_id)) or 0)
    if held + adding > limit:
        what = "folders" if kind is Folder else "runs"
        owner = session.scalar(select(User.name).where(User.id == owner_id)) or "?"
        raise TooLarge(
            f"the folder tree of {owner!r} would hold {held + adding} {what}, over the server's limit of {limit} per "
            f"user: delete {what} no longer needed, or ask an admin to raise `ember server --max-user-{what}`"
        )


def ensure_folder(
    session: Session, user: User, path: str, make: bool, parents: bool | None = None, *, max_folders: int | None
) -> Folder:
    """The folder to upload into, created when ``make``; needs edit there.

    ``parents`` (default: ``make``) also creates missing folders above it; without it only a
    direct child of an existing folder is made. Each user's ``default`` folder (where runs go
    unless told otherwise) is made when needed. New folders belong to the tree's owner, and are
    refused (413, none made) when they would take it past ``max_folders`` (None: no limit). The
    tree's owner is locked (:func:`lock_owner`) before anything is written: the caller writes
    into the folder next.
    """
    path = naming.folder_path(path, home=f"/{user.name}")
    make = make or path == f"/{user.name}/default"
    parents = make if parents is None else parents
    chain = ancestors(path)
    found = {f.path: f for f in session.scalars(select(Folder).where(Folder.path.in_(chain)))}
    if path in found:
        require(level(session, user, found[path]), Level.EDIT, f"folder {path!r}")
        lock_owner(session, found[path].owner_id)
        return found[path]
    existing = next((p for p in chain if p in found), None)
    if existing is None:
        raise NotFound(f"folder {path!r}: there is no user {chain[-1][1:]!r} whose home could hold it")
    if not make:
        raise NotFound(f"folder {path!r} does not exist; pass make_folder=true to create it")
    parent = found[existing]
    if not parents and existing != chain[1]:
        raise NotFound(f"folder {chain[1]!r} does not exist; pass parents=true to create it too")
    require(level(session, user, parent), Level.EDIT, f"folder {existing!r}")
    owner = found[chain[-1]].owner_id if chain[-1] in found else parent.owner_id
    lock_owner(session, owner)
    check_owned(session, Folder, owner, chain.index(existing), max_folders)
    for missing in reversed(chain[: chain.index(existing)]):
        parent = _create(session, missing, parent, owner)
    return parent


def _create(session: Session, path: str, parent: Folder, owner_id: int) -> Folder:
    """Create one folder owned by the tree's owner; a concurrent creator of the same path wins harmlessly."""
    folder = Folder(path=path, parent_id=parent.id, owner_id=owner_id, created=now())
    try:
        with session.begin_nested():
            session.add(folder)
    except IntegrityError:
        existing = session.scalar(select(Folder).where(Folder.path == path))
        if existing is None:
            raise
        return existing
    return folder


def make_home(session: Session, user: User) -> Folder:
    """Create ``/<user>``, owned by the user."""
    home = Folder(path=f"/{user.name}", parent_id=None, owner_id=user.id, created=now())
    session.add(home)
    session.flush()
    return home


def set_share(session: Session, kind: str, node_pk: int, grantee: str, new_level: str) -> None:
    """Grant ``view``/``edit`` to a user name or ``*``, or remove the grant with ``none``.

    Removing a grantee's share of a folder removes their grants on everything beneath it too.
    """
    row = session.scalar(
        select(Share).where(Share.node_kind == kind, Share.node_id == node_pk, Share.grantee == grantee)
    )
    if new_level == "none":
        if row is not None:
            session.delete(row)
        if kind == "folder":
            _revoke_below(session, node_pk, grantee)
    elif row is None:
        held = session.scalar(select(func.count()).where(Share.node_kind == kind, Share.node_id == node_pk)) or 0
        if held >= MAX_GRANTS:
            raise TooLarge(f"this {kind} carries {held} grants, the most one may: remove some first")
        session.add(Share(node_kind=kind, node_id=node_pk, grantee=grantee, level=new_level))
    else:
        row.level = new_level


def _revoke_below(session: Session, folder_pk: int, grantee: str) -> None:
    """Delete ``grantee``'s grants on every folder, run and artifact beneath a folder."""
    root = session.get(Folder, folder_pk)
    if root is None:
        return
    below = select(Folder.id).where(Folder.path.startswith(root.path + "/", autoescape=True))
    nodes = {
        "folder": below,
        "run": select(Run.pk).where(Run.folder_id.in_(below) | (Run.folder_id == folder_pk)),
        "artifact": select(Artifact.pk).where(Artifact.folder_id.in_(below) | (Artifact.folder_id == folder_pk)),
    }
    for kind, pks in nodes.items():
        session.execute(delete(Share).where(Share.grantee == grantee, Share.node_kind == kind, Share.node_id.in_(pks)))


def forget_grantee(session: Session, name: str) -> None:
    """Drop grants made to a user name before that user existed (a new user starts with none).

    Sharing with an unknown name is stored like any grant, so the answer does not tell which
    users exist; it must not give access to whoever is later created with that name.
    """
    session.execute(delete(Share).where(Share.grantee == name))


def shares_of(session: Session, kind: str, node_pk: int) -> list[dict[str, str]]:
    """The grants set directly on a node."""
    rows = session.scalars(select(Share).where(Share.node_kind == kind, Share.node_id == node_pk)).all()
    return [{"grantee": r.grantee, "level": r.level} for r in sorted(rows, key=lambda r: r.grantee)]


def drop_shares(session: Session, kind: str, node_pk: int) -> None:
    """Remove a deleted node's grants (a reused primary key must not inherit them)."""
    session.execute(delete(Share).where(Share.node_kind == kind, Share.node_id == node_pk))
