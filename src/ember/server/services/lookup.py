"""The runs and artifacts a caller may reach: the one lookup every route and console page uses.

Each function answers a node only when the caller holds the ``needed`` level on it
(:func:`ember.server.services.perms.level`); a node the caller may not view is answered exactly as one
that does not exist (:class:`~ember.server.storage.domain_errors.NotFound`), one they may view but not
change with :class:`~ember.server.storage.domain_errors.Forbidden`. Folders:
:func:`ember.server.services.perms.get_folder`.

Example:
    >>> run = get_run(session, user, run_id, Level.EDIT)
"""

from __future__ import annotations

from typing import TypeVar

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from ember.server.services import naming
from ember.server.services.perms import Level, level, require
from ember.server.storage.domain_errors import Conflict, NotFound
from ember.server.storage.models import Artifact, ArtifactFile, Folder, Run, User

_Node = TypeVar("_Node", Run, Artifact)


def _get(session: Session, user: User, model: type[_Node], node_id: str, what: str, needed: Level) -> _Node:
    node = session.scalar(select(model).where(model.id == naming.node_id(node_id, f"{what} id")))
    if node is None:
        raise NotFound(f"{what} {node_id} does not exist or is not shared with you")
    require(level(session, user, node), needed, f"{what} {node_id}")
    return node


def get_run(session: Session, user: User, run_id: str, needed: Level = Level.VIEW, trashed: bool = False) -> Run:
    """The run with this id if the caller has ``needed`` on it (404/403 otherwise).

    A run in the trash answers 404 like a missing one, unless ``trashed`` (restoring, purging).
    """
    run = _get(session, user, Run, run_id, "run", needed)
    if run.deleted is not None and not trashed:
        raise NotFound(f"run {run_id} does not exist or is not shared with you")
    return run


def get_runs(session: Session, user: User, run_ids: list[str], needed: Level = Level.VIEW) -> list[Run]:
    """:func:`get_run` of each id, in order, with one query for the rows (a compare page's 100 runs).

    The same checks and refusals, id by id: the first id refused raises what :func:`get_run` raises.
    """
    checked = [naming.node_id(run_id, "run id") for run_id in run_ids]
    rows = {run.id: run for run in session.scalars(select(Run).where(Run.id.in_(checked)))} if checked else {}
    folders: dict[int, Folder] = {}  # held here: the session's identity map keeps no row alive
    found = []
    for run_id in checked:
        run = rows.get(run_id)
        if run is None or run.deleted is not None:
            raise NotFound(f"run {run_id} does not exist or is not shared with you")
        if run.folder_id not in folders:
            folder = session.get(Folder, run.folder_id)
            assert folder is not None
            folders[run.folder_id] = folder
        require(level(session, user, run, folders[run.folder_id]), needed, f"run {run_id}")
        found.append(run)
    return found


def get_artifact(session: Session, user: User, artifact_id: str, needed: Level = Level.VIEW) -> Artifact:
    """The artifact with this id if the caller has ``needed`` on it (404/403 otherwise)."""
    return _get(session, user, Artifact, artifact_id, "artifact", needed)


def get_artifact_file(session: Session, user: User, artifact_id: str, path: str) -> ArtifactFile:
    """The file ``path`` of an artifact the caller may view (404 for a missing artifact or file)."""
    artifact = get_artifact(session, user, artifact_id)
    row = session.scalar(
        select(ArtifactFile).where(
            ArtifactFile.artifact_pk == artifact.pk, ArtifactFile.path == naming.rel_path(path, "file path")
        )
    )
    if row is None:
        raise NotFound(f"artifact {artifact_id} has no file {path!r}")
    return row


_ID_LOCK = 7316872  # the first key of the PostgreSQL advisory locks on node ids (blobs.lock uses 7316871)


def claim_id(session: Session, kind: str, node_id: str) -> None:
    """Refuse (409) to create a ``kind`` node with an id that a node of the other kind holds.

    Runs and artifacts each get a fresh uuid4 id, so a shared id is a copy, or someone taking
    the id of a node they can see. On PostgreSQL the id stays locked until the transaction
    ends, so a run and an artifact created at once with one id cannot both pass.

    Raises:
        Conflict: the other kind holds ``node_id``.
    """
    refused = claim_ids(session, kind, [node_id]).get(node_id)
    if refused is not None:
        raise refused


def claim_ids(session: Session, kind: str, node_ids: list[str]) -> dict[str, Conflict]:
    """:func:`claim_id` for many ids at once (one query): the refusal of each id the other kind holds.

    Example:
        >>> refused = claim_ids(session, "run", ids)   # {} when every id is free
    """
    if session.get_bind().dialect.name == "postgresql":
        for node_id in sorted(set(node_ids)):  # one order for every transaction: no deadlock between them
            session.execute(text(f"SELECT pg_advisory_xact_lock({_ID_LOCK}, hashtext(:id))"), {"id": node_id})
    other, other_kind = (Artifact, "an artifact") if kind == "run" else (Run, "a run")
    taken = set(session.scalars(select(other.id).where(other.id.in_(node_ids)))) if node_ids else set()
    return {
        node_id: Conflict(
            f"the id {node_id} is taken by {other_kind}: {'a run' if kind == 'run' else 'an artifact'} needs an id "
            "of its own (ember gives each run and artifact a fresh one: was this one copied?)"
        )
        for node_id in taken
    }
