"""``ember ui`` writes runs into its database in process: the upload protocol without HTTP.

:class:`DirectClient` stands in for :class:`ember.track.client.Client` under
:func:`ember.track.client.upload_run`: the run is read exactly as ``ember upload`` reads it, and
each request it would send is answered by the server's own code in this process. The body goes
through the wire's decoder (:func:`ember.server.services.codec.loads`), the route's pydantic model and the
route's checks, as over HTTP; only the sockets, the JSON text of the answer and the key check
are left out, so indexing a run costs a few SQL statements instead of several HTTP round trips.
Each request is a savepoint of the caller's transaction: a refused one changes nothing.

:func:`mark_damaged` records a run folder ember could not have written (or whose files the
server refuses) as status ``Damaged`` with the reason, so the console lists it beside the others.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from ember.server.api.errors import status_of
from ember.server.services import codec, edges, ingest, logs, naming, run_images, runs
from ember.server.services.lookup import get_run
from ember.server.services.perms import Level, ensure_folder
from ember.server.storage.domain_errors import DomainError
from ember.server.storage.models import Artifact, Folder, Run, User, now
from ember.server.storage.schemas import LineageBatch, LogChunkIn, MetricBatch, RunIn
from ember.track.client import Client, UploadError

DAMAGED = "Damaged"
log = logging.getLogger("ember.server")


class DirectClient:
    """The upload client's ``call`` for a run's requests, answered in this process (see the module).

    Example:
        >>> with sessions() as session, session.begin():
        ...     upload_run(path, client=DirectClient(session, user, max_points=20_000), artifacts=False)
    """

    def __init__(self, session: Session, user: User, max_points: int) -> None:
        self.session, self.user, self.max_points = session, user, max_points

    def call(self, method: str, path: str, json: Any = None, **_: Any) -> Any:
        """Answer one request of the upload protocol, or raise :class:`UploadError` as the client would.

        Raises:
            UploadError: the server's code refused the request (its status and message), or it is
                not a run request (artifacts go over HTTP: their bytes are streamed to the blob store).
        """
        parts = path.strip("/").split("/")
        try:
            body = codec.loads(as_sent(json)) if json is not None else None
            with self.session.begin_nested():
                return self._answer(method, parts, body)
        except DomainError as e:
            raise UploadError(f"{method} {path} -> {status_of(e)}: {e.detail}") from None
        except ValidationError as e:
            raise UploadError(f"{method} {path} -> 422: {validation_text(e)}") from None

    def _answer(self, method: str, parts: list[str], body: Any) -> Any:
        session, user = self.session, self.user
        if len(parts) < 2 or parts[0] != "runs":
            raise UploadError(f"{method} /{'/'.join(parts)}: ember ui sends only a run's requests in process")
        run_id, rest = parts[1], parts[2:]
        if method == "PUT" and not rest:
            return runs.put_run(session, user, run_id, RunIn.model_validate(body))
        if method == "DELETE" and not rest:
            return runs.delete_run(session, user, run_id)
        run = get_run(session, user, run_id, Level.EDIT)
        if method == "POST" and rest == ["metrics"]:
            batch = MetricBatch.model_validate(body)
            return {"cursor": ingest.store_metrics(session, run.pk, run.id, batch, self.max_points)}
        if method == "POST" and rest == ["log"]:
            chunk = LogChunkIn.model_validate(body)  # the user's own store: no limits
            cursor = logs.store_log(session, run, chunk.start, chunk.end, chunk.text, max_bytes=None, quota=None)
            return {"cursor": cursor}
        if method == "POST" and rest == ["lineage"]:
            lines = LineageBatch.model_validate(body)
            return {"cursor": edges.store_edges(session, "run", run.id, lines.edges, lines.start, lines.end)}
        if method == "POST" and rest == ["images"]:
            pictures = run_images.ImagesBatch.model_validate(body)  # the user's own store: no limits
            return {"cursor": run_images.store_images(session, run, pictures, max_images=None, quota=None)}
        raise UploadError(f"{method} /{'/'.join(parts)}: not a request of the upload protocol")


def as_sent(body: Any) -> bytes:
    """A request body as the HTTP client sends it (NaN as a bare literal, which the wire refuses; text escaped)."""
    return json.dumps(body, separators=(",", ":")).encode()


def validation_text(e: ValidationError) -> str:
    """The first error of a pydantic validation, as ``field: message``."""
    errors = e.errors()
    if not errors:
        return "invalid"
    return f"{'.'.join(str(p) for p in errors[0]['loc'])}: {errors[0]['msg']}"


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
        return ensure_folder(session, user, fallback, make=True)
    try:
        with session.begin_nested():
            return ensure_folder(session, user, wanted, make=True)
    except DomainError:
        return ensure_folder(session, user, fallback, make=True)


def _name(wanted: Any, folder_name: str) -> str:
    """run.json's name when the server accepts it, else the folder's name (cut to fit)."""
    if not isinstance(wanted, str):
        return folder_name[:100]
    try:
        return naming.display_name(wanted, "run.name")
    except DomainError:  # a name the server refuses: the run is shown under its folder's name
        return folder_name[:100]


def forget_run(client: DirectClient, run_id: str) -> None:
    """Delete a run whose folder left the store (or that is now listed under another id)."""
    try:
        client.call("DELETE", f"/runs/{run_id}")
    except UploadError as e:
        log.warning("ember ui: could not drop run %s: %s", run_id, e)


def forget_artifact(client: Client, artifact_id: str) -> None:
    """Delete an artifact whose folder left the store (over HTTP, as it was uploaded)."""
    try:
        client.call("DELETE", f"/artifacts/{artifact_id}")
    except UploadError as e:
        log.warning("ember ui: could not drop artifact %s: %s", artifact_id, e)
