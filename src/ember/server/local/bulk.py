"""``ember ui``'s cold start: many new runs written with a few statements each, as the upload would write them.

Request by request (:class:`ember.server.local.direct.DirectClient`) a run costs some 25 SQL
statements, most of them re-reading cursors a new run does not have yet: 10,000 runs took minutes.
For runs the database does not hold yet, :class:`Recorder` stands in for the HTTP client under
:func:`ember.track.client.upload_run` (so the run is read exactly as ``ember upload`` reads it)
and answers as the server answers for a new run: every cursor at 0, each range accepted. It keeps
each request, decoded as the wire decodes it (:func:`ember.server.services.codec.loads`) and checked by the route's
model. :func:`write` then applies a batch of recorded runs with the routes' own checks and row
builders (``runs.checked_meta``/``apply_meta``, ``ingest.metric_rows``, ``edges.edge_rows``,
``logs.pieces``, ``ingest.summarize``): one insert for the batch's runs, one for their cursors,
output pieces and lineage edges, and per metric type of a run one insert of points and one of
block summaries.

A run whose request is refused keeps what came before it and is reported with the reason (the
caller lists it ``Damaged``), as over HTTP. ``tests/console/test_index.py`` checks that a store
indexed this way and the same store sent request by request give the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from ember.server.api.errors import status_of
from ember.server.local.direct import as_sent, validation_text
from ember.server.services import codec, edges, ingest, logs, naming, run_images
from ember.server.services.lookup import claim_id
from ember.server.services.perms import ensure_folder
from ember.server.services.runs import apply_meta, checked_meta
from ember.server.storage.domain_errors import DomainError
from ember.server.storage.models import Cursor, Edge, Folder, LogPiece, Run, RunImage, User
from ember.server.storage.schemas import LineageBatch, LogChunkIn, MetricBatch, RunIn
from ember.track.client import UploadError


@dataclass
class Recorded:
    """One run's requests as :func:`ember.track.client.upload_run` sent them, for :func:`write`.

    Attributes:
        name: the run's folder name in the store.
        run_id: the id of its ``PUT /runs/{id}``; run: that request's body.
        requests: the later requests in order, as ``(route, stream, body)``: ``("metrics",
            "metrics/train.jsonl", MetricBatch(...))``.
        error: why reading stopped (a damaged line, a refused body), when it did.
    """

    name: str
    run_id: str = ""
    run: RunIn | None = None
    requests: list[tuple[str, str, MetricBatch | LogChunkIn | LineageBatch | run_images.ImagesBatch]] = field(
        default_factory=list
    )
    error: str | None = None


class Recorder:
    """The upload client of a run the server does not hold yet: records its requests (see the module).

    Example:
        >>> recorder = Recorder(Recorded("mnist_260520_101500_a1b2c3"))
        >>> upload_run(path, client=recorder, artifacts=False)
    """

    def __init__(self, recorded: Recorded) -> None:
        self.recorded = recorded
        self._ends: dict[str, int] = {}

    def call(self, method: str, path: str, json: Any = None, **_: Any) -> Any:
        """Record one request; answer as the server answers for a new run.

        Raises:
            UploadError: the body is refused as the route would refuse it, or the request is not
                a run's (artifacts are uploaded over HTTP).
        """
        parts = path.strip("/").split("/")
        try:
            body = codec.loads(as_sent(json))
            return self._record(method, parts, body)
        except DomainError as e:
            raise UploadError(f"{method} {path} -> {status_of(e)}: {e.detail}") from None
        except ValidationError as e:
            raise UploadError(f"{method} {path} -> 422: {validation_text(e)}") from None

    def _record(self, method: str, parts: list[str], body: Any) -> dict[str, Any]:
        rec = self.recorded
        if method == "PUT" and len(parts) == 2 and parts[0] == "runs":
            rec.run_id, rec.run = naming.node_id(parts[1], "run id"), RunIn.model_validate(body)
            return {"id": rec.run_id, "action": "created", "folder": "", "cursors": {}}
        if method != "POST" or len(parts) != 3 or parts[:2] != ["runs", rec.run_id]:
            raise UploadError(f"{method} /{'/'.join(parts)}: not a request of a new run's upload")
        request: MetricBatch | LogChunkIn | LineageBatch | run_images.ImagesBatch
        if parts[2] == "metrics":
            request = MetricBatch.model_validate(body)
            stream = f"metrics/{request.type}.jsonl"
        elif parts[2] == "log":
            request, stream = LogChunkIn.model_validate(body), "stdout.log"
        elif parts[2] == "lineage":
            request, stream = LineageBatch.model_validate(body), "lineage.jsonl"
        elif parts[2] == "images":
            request, stream = run_images.ImagesBatch.model_validate(body), run_images.STREAM
        else:
            raise UploadError(f"POST /{'/'.join(parts)}: not a request of the upload protocol")
        if request.end < request.start or request.start != self._ends.get(stream, 0):
            raise UploadError(
                f"{stream}: bytes {request.start}-{request.end} do not follow {self._ends.get(stream, 0)}"
            )
        rec.requests.append((parts[2], stream, request))
        self._ends[stream] = request.end
        return {"cursor": request.end}


def write(session: Session, user: User, batch: list[Recorded], max_points: int) -> dict[str, str | None]:
    """Write recorded new runs (each id absent from the database) in a few statements.

    Args:
        session: inside the caller's transaction.
        user: the uploader (``ember ui``'s local user).
        batch: the recorded runs, each with its ``run``.
        max_points: the most values one metrics request may hold (the server's setting).

    Returns:
        By folder name: None when the run was written whole, else why not all of it was (what
        came before the refused request is written; a run refused at its ``PUT`` is not).
    """
    outcome: dict[str, str | None] = {}
    folders: dict[str, Folder | DomainError] = {}
    runs: list[tuple[Recorded, Run]] = []
    for rec in batch:
        outcome[rec.name] = rec.error
        assert rec.run is not None, f"{rec.name}: write() needs a recorded PUT"
        try:
            meta = checked_meta(rec.run, rec.run_id)
            claim_id(session, "run", rec.run_id)
            if rec.run.folder not in folders:
                try:
                    with session.begin_nested():
                        folders[rec.run.folder] = ensure_folder(session, user, rec.run.folder, rec.run.make_folder)
                except DomainError as e:
                    folders[rec.run.folder] = e
            place = folders[rec.run.folder]
            if isinstance(place, DomainError):
                raise place
        except DomainError as e:
            outcome[rec.name] = f"PUT /runs/{rec.run_id} -> {status_of(e)}: {e.detail}"
            continue
        run = Run(id=rec.run_id, folder_id=place.id, owner_id=place.owner_id, platform={})
        apply_meta(run, meta, rec.run.platform)
        runs.append((rec, run))
    session.add_all([run for _, run in runs])
    session.flush()  # one INSERT for the batch; the runs' primary keys
    points: dict[tuple[int, str], list[tuple[Any, ...]]] = {}
    cursors: list[dict[str, Any]] = []
    output: list[dict[str, Any]] = []
    lineage: list[dict[str, Any]] = []
    pictures: list[dict[str, Any]] = []
    for rec, run in runs:
        ends: dict[str, int] = {}
        texts: list[str] = []
        for route, stream, request in rec.requests:
            try:
                moved = _rows(run, request, max_points, points, texts, lineage, pictures)
            except DomainError as e:
                outcome[rec.name] = f"POST /runs/{run.id}/{route} -> {status_of(e)}: {e.detail}"
                break
            if moved:
                ends[stream] = request.end
        cursors += [{"node_kind": "run", "node_id": run.id, "stream": s, "offset": end} for s, end in ends.items()]
        if texts:
            output += logs.pieces(run.pk, "".join(texts), 0, 0)
            run.log_bytes = output[-1]["end"]
    for (pk, type_), rows in points.items():
        ingest.insert_points(session, rows)
        ingest.summarize(session, pk, type_, None, 0)
    ingest.insert_ignore(session, Cursor, cursors, ["node_kind", "node_id", "stream"])
    ingest.insert_ignore(session, LogPiece, output, ["run_pk", "start"])
    ingest.insert_ignore(session, Edge, lineage, ["source_kind", "source_id", "target_kind", "target_id"])
    ingest.insert_ignore(session, RunImage, pictures, ["run_pk", "name", "step"])
    session.flush()
    return outcome


def _rows(
    run: Run,
    request: MetricBatch | LogChunkIn | LineageBatch | run_images.ImagesBatch,
    max_points: int,
    points: dict[tuple[int, str], list[tuple[Any, ...]]],
    texts: list[str],
    lineage: list[dict[str, Any]],
    pictures: list[dict[str, Any]],
) -> bool:
    """Append the rows one request of a new run adds, as its route stores them; whether it moves its cursor."""
    if isinstance(request, MetricBatch):
        rows = ingest.metric_rows(run.pk, request.type, request.columns(), max_points)
        points.setdefault((run.pk, request.type), []).extend(rows)
    elif isinstance(request, LogChunkIn):
        if request.end <= request.start or not request.text:
            return False  # as logs.store_log: nothing stored, the cursor stays
        texts.append(request.text)
    elif isinstance(request, run_images.ImagesBatch):
        pictures.extend(run_images.image_rows(run.pk, request.images))
    else:
        lineage.extend(edges.edge_rows("run", run.id, request.edges))
    return True
