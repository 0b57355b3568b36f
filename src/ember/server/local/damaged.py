"""``ember ui``'s run folders that ember could not have written: listed ``Damaged`` with the reason.

:func:`mark_damaged` records a run folder ember could not have written (or whose files the
server refuses) as status ``Damaged`` with the reason, so the console lists it beside the others;
:func:`forget_run` and :func:`forget_artifact` drop what left the store.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ember.server.services import naming
from ember.server.services.perms import ensure_folder
from ember.server.services.upload import Uploads
from ember.server.storage.domain_errors import DomainError
from ember.server.storage.models import Artifact, Folder, Run, User, now
from ember.track.client import Client, UploadError

DAMAGED = "Damaged"
log = logging.getLogger("ember.server")


def damaged_id(folder_name: str) -> str:
    """The id a damaged run folder is listed under when its run.json gives no usable one (stable per folder)."""
    return hashlib.sha256(f"ember ui damaged run {folder_name}".encode()).hexdigest()[:32]


def mark_damaged(session: Session, user: User, run_id: str, folder_name: str, meta: dict[str, Any], reason: str) -> Run:
    """Record the run ``run_id`` as ``Damaged`` with ``reason``, creating its row when missing (under the
    folder's :func:`damaged_id` when an artifact holds ``run_id``).

    A row already indexed keeps what was stored (its points, its log) and its metadata, with the
    status and the reason replaced. A new row takes what ``meta`` holds that the server accepts
    (name, folder, start time), else the folder's name and the ``default`` folder.

    Returns:
        The run's row.
    """
    run = session.scalar(select(Run).where(Run.id == run_id))
    if run is None and session.scalar(select(Artifact.pk).where(Artifact.id == run_id)) is not None:
        run_id = damaged_id(folder_name)  # an artifact holds the id: runs and artifacts never share one
        run = session.scalar(select(Run).where(Run.id == run_id))
    if run is None:
        folder = _folder(session, user, meta.get("folder"))
        start = meta.get("start_time")
        run = Run(
            id=run_id,
            folder_id=folder.id,
            owner_id=folder.owner_id,
            name=_name(meta.get("name"), folder_name),
            start_time=start if isinstance(start, str) and len(start) <= 40 else None,
            end_time=None,
            labels=[],
            description="",
            hparams={},
            platform={},
        )
        session.add(run)
        run.meta = {}
    run.status = DAMAGED
    run.meta = {**(run.meta or {}), "status": DAMAGED, "reason": reason, "local_folder": folder_name}
    run.uploaded = now()
    session.flush()
    return run


def _folder(session: Session, user: User, wanted: Any) -> Folder:
    """The run's folder when run.json names one the server accepts, else ``default``."""
    fallback = "default"  # no folder, or one the server refuses: the Damaged run's reason says why
    if not isinstance(wanted, str):
        return ensure_folder(session, user, fallback, make=True, max_folders=None)
    try:
        with session.begin_nested():
            return ensure_folder(session, user, wanted, make=True, max_folders=None)
    except DomainError:
        return ensure_folder(session, user, fallback, make=True, max_folders=None)


def _name(wanted: Any, folder_name: str) -> str:
    """run.json's name when the server accepts it, else the folder's name (cut to fit)."""
    if not isinstance(wanted, str):
        return folder_name[:100]
    try:
        return naming.display_name(wanted, "run.name")
    except DomainError:  # a name the server refuses: the run is shown under its folder's name
        return folder_name[:100]


def forget_run(uploads: Uploads, run_id: str) -> None:
    """Delete a run whose folder left the store (or that is now listed under another id)."""
    try:
        uploads.delete_run(run_id)
    except UploadError as e:
        log.warning("ember ui: could not drop run %s: %s", run_id, e)


def forget_artifact(client: Client, artifact_id: str) -> None:
    """Delete an artifact whose folder left the store (over HTTP, as it was uploaded)."""
    try:
        client.call("DELETE", f"/artifacts/{artifact_id}")
    except UploadError as e:
        log.warning("ember ui: could not drop artifact %s: %s", artifact_id, e)
