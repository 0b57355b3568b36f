"""The upload protocol, received once: what the server stores of a run or an artifact, however it came.

:class:`Uploads` is the server's :class:`ember.track.receiver.Receiver`: each method checks a
body as the HTTP API checks it (the wire's decoder, :mod:`ember.server.services.codec`, then
the request's pydantic model), finds the node with the rights the action needs
(:mod:`ember.server.services.lookup`) and stores it through the service of its kind (``runs``,
``ingest``, ``logs``, ``edges``, ``run_images``, ``blobs``, ``artifacts``). The API's routes call
it with the bodies FastAPI already decoded; ``ember ui``'s index calls it in process, under
:func:`ember.track.client.upload_run`, exactly as ``ember upload`` would send the run over HTTP.

:class:`NewRuns` is the batched receiver, for runs the database does not hold yet (``ember ui``'s
cold start): it checks each body as :class:`Uploads` does and answers as the server answers for
a new run (every cursor at 0, each range accepted), keeping the rows; :meth:`NewRuns.write` then
inserts a batch of runs with a few statements (one for the runs, one each for their cursors,
output pieces, lineage and images, and per metric type of a run one for points and one for
block summaries), with the row builders :class:`Uploads` uses.

Example:
    >>> with app.state.sessions() as session, session.begin():
    ...     upload_run(run.path, client=Uploads(session, user, settings, in_process=True), artifacts=False)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import IO, Any, TypeVar, cast

from pydantic import BaseModel, ValidationError
from sqlalchemy import Table, insert, select
from sqlalchemy.orm import Session

from ember.server.services import artifacts, codec, edges, ingest, logs, naming, run_images, runs
from ember.server.services import blobs as blob_rules
from ember.server.services.blobs import BlobStore
from ember.server.services.lookup import claim_ids, get_artifact, get_run
from ember.server.services.perms import Level, ensure_folder
from ember.server.services.run_images import ImagesBatch
from ember.server.storage.domain_errors import DomainError, Invalid
from ember.server.storage.models import Cursor, Edge, Folder, LogPiece, Run, RunImage, User
from ember.server.storage.schemas import ArtifactIn, LineageBatch, LogChunkIn, MetricBatch, RunIn
from ember.server.storage.settings import Settings
from ember.track import receiver as protocol
from ember.track.client import UploadError

Body = TypeVar("Body", bound=BaseModel)
Batch = MetricBatch | LogChunkIn | LineageBatch | ImagesBatch


def as_sent(body: Any) -> bytes:
    """A request body as the HTTP client sends it (NaN as a bare literal, which the wire refuses; text escaped)."""
    return json.dumps(body, separators=(",", ":")).encode()


def validation_text(e: ValidationError) -> str:
    """The first error of a pydantic validation, as ``field: message``."""
    errors = e.errors()
    if not errors:
        return "invalid"
    return f"{'.'.join(str(p) for p in errors[0]['loc'])}: {errors[0]['msg']}"


def decoded(model: type[Body], body: Any) -> Body:
    """``body`` as the API's route receives it: a model already decoded by the route is itself; a body
    sent in process goes through the wire's decoder and the model (:class:`Invalid` where either refuses)."""
    if isinstance(body, model):
        return body
    try:
        return model.model_validate(codec.loads(as_sent(body)))
    except ValidationError as e:
        raise Invalid(validation_text(e)) from None


class Uploads:
    """The server's receiver of the upload protocol (see the module), on one database session.

    Args:
        session: the caller's session, inside its transaction.
        user: who uploads (rights and quota are theirs).
        settings: the server's limits (metric values per request, distinct metrics per run, output
            per run, images per run, runs and folders per user, quota, blob size).
        blobs: the blob store (for :meth:`missing_blobs`, :meth:`put_blob`, :meth:`put_artifact`).
        in_process: an upload in this process (``ember ui``): each request is a savepoint of the
            caller's transaction (a refused one changes nothing) and a refusal is an
            :class:`~ember.track.client.UploadError` naming the request, its status and why, as the
            HTTP client raises it. Otherwise (the API's routes) refusals are the services'
            :class:`~ember.server.storage.domain_errors.DomainError`, which the API answers.
        own_store: the uploader's own local store (``ember ui``): no bound on a run's output, images,
            metrics, the user's runs and folders, or the quota.

    Example:
        >>> Uploads(session, user, settings).put_metrics(run_id, {"type": "train", "start": 0, ...})
        160
    """

    def __init__(
        self,
        session: Session,
        user: User,
        settings: Settings,
        blobs: BlobStore | None = None,
        in_process: bool = False,
        own_store: bool = False,
    ) -> None:
        self.session, self.user, self.settings, self.blobs = session, user, settings, blobs
        self.in_process = in_process
        self.max_log_bytes = None if own_store else settings.max_log_bytes
        self.max_run_images = None if own_store else settings.max_run_images
        self.quota_bytes = None if own_store else settings.quota_bytes
        self.max_run_metrics = None if own_store else settings.max_run_metrics
        self.max_user_runs = None if own_store else settings.max_user_runs
        self.max_user_folders = None if own_store else settings.max_user_folders

    @contextmanager
    def _request(self, name: str) -> Iterator[None]:
        """One request of the protocol (``name``: its HTTP form, for an in-process refusal)."""
        if not self.in_process:
            yield
            return
        try:
            with self.session.begin_nested():
                yield
        except DomainError as e:
            raise refusal(name, e) from None

    def _store(self) -> BlobStore:
        assert self.blobs is not None, "Uploads(blobs=...) is needed for an artifact's requests"
        return self.blobs

    def put_run(self, run_id: str, body: protocol.RunBody | RunIn) -> protocol.Answer:
        """Create or update a run from its run.json and platform.json (:func:`runs.put_run`)."""
        with self._request(f"PUT /runs/{run_id}"):
            body = decoded(RunIn, body)
            limits = {"max_runs": self.max_user_runs, "max_folders": self.max_user_folders}
            return cast(protocol.Answer, runs.put_run(self.session, self.user, run_id, body, **limits))

    def put_metrics(self, run_id: str, batch: protocol.MetricColumns | MetricBatch) -> int:
        """Store complete lines of ``metrics/<type>.jsonl`` (:func:`ingest.store_metrics`); the new cursor."""
        with self._request(f"POST /runs/{run_id}/metrics"):
            lines = decoded(MetricBatch, batch)
            run = get_run(self.session, self.user, run_id, Level.EDIT)
            blob_rules.hold(self.session, run.owner_id, self.quota_bytes)
            quota = partial(blob_rules.charge_points, self.session, run.owner_id, self.quota_bytes)
            max_points = self.settings.max_batch_points
            return ingest.store_metrics(self.session, run.pk, run.id, lines, max_points, self.max_run_metrics, quota)

    def put_log(self, run_id: str, chunk: protocol.LogText | LogChunkIn) -> int:
        """Store text of ``stdout.log`` (:func:`logs.store_log`, 413 past the output limit or the quota)."""
        with self._request(f"POST /runs/{run_id}/log"):
            text = decoded(LogChunkIn, chunk)
            run = get_run(self.session, self.user, run_id, Level.EDIT)
            return logs.store_log(
                self.session, run, text.start, text.end, text.text, self.max_log_bytes, self.quota_bytes
            )

    def put_lineage(self, kind: protocol.NodeKind, node_id: str, lines: protocol.LineageLines | LineageBatch) -> int:
        """Store complete lines of a run's or artifact's ``lineage.jsonl`` (:func:`edges.store_edges`)."""
        with self._request(f"POST /{kind}s/{node_id}/lineage"):
            batch = decoded(LineageBatch, lines)
            find = get_run if kind == "run" else get_artifact
            node = find(self.session, self.user, node_id, Level.EDIT)
            return edges.store_edges(self.session, kind, node.id, batch.edges, batch.start, batch.end)

    def put_images(self, run_id: str, batch: protocol.ImageLines | ImagesBatch) -> int:
        """Store lines of ``images.jsonl`` with their PNGs (:func:`run_images.store_images`)."""
        with self._request(f"POST /runs/{run_id}/images"):
            pictures = decoded(ImagesBatch, batch)
            run = get_run(self.session, self.user, run_id, Level.EDIT)
            return run_images.store_images(self.session, run, pictures, self.max_run_images, self.quota_bytes)

    def missing_blobs(self, digests: list[str]) -> set[str]:
        """Which of these blobs the uploader has not uploaded (whether anyone else holds the bytes is not told)."""
        with self._request("POST /blobs/missing"):
            wanted = sorted({naming.sha256(s) for s in digests})
            have = blob_rules.own(self.session, self.user, wanted)
            store = self._store()
            return {s for s in wanted if s not in have or not store.has(s)}

    def put_blob(self, sha256: str, file: IO[bytes]) -> None:
        """Store one file's bytes read in this thread (the API's route streams them instead:
        :meth:`BlobStore.receive`); refused unless they hash to ``sha256``, or past the limits."""
        with self._request(f"PUT /blobs/{sha256}"):
            sha, store = naming.sha256(sha256), self._store()
            used = (
                blob_rules.upload_usage(self.session, self.user.id, self.settings)
                if self.quota_bytes is not None
                else None
            )
            limit, limit_text = blob_rules.upload_limit(self.settings, self.user, used)
            tmp = store.take(sha, file, limit, limit_text)
            try:
                blob_rules.record_in(self.session, store, self.settings, self.user, sha, tmp)
            finally:
                tmp.unlink(missing_ok=True)

    def put_artifact(self, artifact_id: str, body: protocol.ArtifactBody | ArtifactIn) -> protocol.Answer:
        """Create or update an artifact; every file's blob must be put first (:func:`artifacts.put_artifact`)."""
        with self._request(f"PUT /artifacts/{artifact_id}"):
            meta = decoded(ArtifactIn, body)
            answer = artifacts.put_artifact(self.session, self.user, artifact_id, meta, self._store(), self.settings)
            return cast(protocol.Answer, answer)

    def delete_run(self, run_id: str) -> dict[str, Any]:
        """Delete a run and everything stored of it (:func:`runs.delete_run`)."""
        with self._request(f"DELETE /runs/{run_id}"):
            return runs.delete_run(self.session, self.user, run_id)

    def delete_artifact(self, artifact_id: str) -> dict[str, Any]:
        """Delete an artifact, and the blobs no other artifact lists (:func:`artifacts.delete_artifact`)."""
        with self._request(f"DELETE /artifacts/{artifact_id}"):
            return artifacts.delete_artifact(self.session, self.user, artifact_id, self._store())


def refusal(request: str, e: DomainError) -> UploadError:
    """A refused request as the HTTP client reports it: ``"POST /runs/<id>/log -> 413: <why>"``."""
    return UploadError(f"{request} -> {e.status}: {e.detail}")


@dataclass
class Recorded:
    """What :class:`NewRuns` kept of one run folder's upload.

    Attributes:
        name: the run's folder name in the store.
        run_id: the id of its :meth:`~NewRuns.put_run`; run: that body, checked.
        requests: the later bodies in order, as ``(request, stream, body)``:
            ``("POST /runs/<id>/metrics", "metrics/train.jsonl", MetricBatch(...))``.
        error: why reading stopped (a damaged line, a refused body), when it did.
    """

    name: str
    run_id: str = ""
    run: RunIn | None = None
    requests: list[tuple[str, str, Batch]] = field(default_factory=list)
    error: str | None = None


class NewRuns:
    """The batched receiver of runs the database does not hold yet (see the module).

    :meth:`open` starts each run folder; :func:`~ember.track.client.upload_run` then sends it as
    to any receiver (``artifacts=False``: artifacts go to :class:`Uploads`); :meth:`write` stores
    every run kept. A body refused by its checks raises :class:`~ember.track.client.UploadError`
    as :class:`Uploads` does in process.

    Example:
        >>> new = NewRuns()
        >>> for path in folders:
        ...     new.open(path.name)
        ...     upload_run(path, None, True, "new", new, artifacts=False)
        >>> new.write(session, user, settings)   # {folder name: None, or why it was not all stored}
    """

    def __init__(self) -> None:
        self.runs: list[Recorded] = []
        self._ends: dict[str, int] = {}

    def open(self, name: str) -> Recorded:
        """Start keeping the upload of the run folder ``name``; what is kept of it."""
        self.runs.append(Recorded(name))
        self._ends = {}
        return self.runs[-1]

    def _current(self, run_id: str, request: str) -> Recorded:
        rec = self.runs[-1] if self.runs else None
        if rec is None or rec.run is None or rec.run_id != run_id:
            raise UploadError(f"{request}: not a request of the new run being kept (open it and put it first)")
        return rec

    def put_run(self, run_id: str, body: protocol.RunBody | RunIn) -> protocol.Answer:
        """Keep a new run's metadata, checked as :meth:`Uploads.put_run` checks it; answer as for a new run."""
        assert self.runs, "NewRuns.open(name) before its put_run"
        rec = self.runs[-1]
        request = f"PUT /runs/{run_id}"
        try:
            rec.run_id, rec.run = naming.node_id(run_id, "run id"), decoded(RunIn, body)
        except DomainError as e:
            raise refusal(request, e) from None
        return {"id": rec.run_id, "action": "created", "folder": "", "cursors": {}}

    def _keep(self, run_id: str, route: str, model: type[Batch], body: Any) -> int:
        request = f"POST /runs/{run_id}/{route}"
        rec = self._current(run_id, request)
        try:
            batch = decoded(model, body)
        except DomainError as e:
            raise refusal(request, e) from None
        stream = {
            "metrics": f"metrics/{getattr(batch, 'type', '')}.jsonl",
            "log": logs.STREAM,
            "lineage": edges.STREAM,
            "images": run_images.STREAM,
        }[route]
        if batch.end < batch.start or batch.start != self._ends.get(stream, 0):
            raise UploadError(f"{stream}: bytes {batch.start}-{batch.end} do not follow {self._ends.get(stream, 0)}")
        rec.requests.append((request, stream, batch))
        self._ends[stream] = batch.end
        return batch.end

    def put_metrics(self, run_id: str, batch: protocol.MetricColumns | MetricBatch) -> int:
        """Keep a batch of ``metrics/<type>.jsonl`` (its rows are built at :meth:`write`)."""
        return self._keep(run_id, "metrics", MetricBatch, batch)

    def put_log(self, run_id: str, chunk: protocol.LogText | LogChunkIn) -> int:
        """Keep text of ``stdout.log``."""
        return self._keep(run_id, "log", LogChunkIn, chunk)

    def put_lineage(self, kind: protocol.NodeKind, node_id: str, lines: protocol.LineageLines | LineageBatch) -> int:
        """Keep lines of the run's ``lineage.jsonl`` (an artifact's go to :class:`Uploads`)."""
        if kind != "run":
            raise UploadError(f"POST /{kind}s/{node_id}/lineage: NewRuns keeps runs only; send artifacts to Uploads")
        return self._keep(node_id, "lineage", LineageBatch, lines)

    def put_images(self, run_id: str, batch: protocol.ImageLines | ImagesBatch) -> int:
        """Keep lines of ``images.jsonl`` with their PNGs."""
        return self._keep(run_id, "images", ImagesBatch, batch)

    def write(
        self, session: Session, user: User, settings: Settings, only: list[Recorded] | None = None
    ) -> dict[str, str | None]:
        """Store the runs kept (each id absent from the database) in a few statements.

        Args:
            session: inside the caller's transaction.
            user: the uploader (``ember ui``'s local user).
            settings: the server's settings (the most values one metrics request may hold).
            only: these of the runs kept (default: all of them).

        Returns:
            By folder name: None when the run was stored whole, else why not all of it was (what
            came before the refused request is stored; a run refused at its ``PUT`` is not).
        """
        outcome: dict[str, str | None] = {}
        folders: dict[str, Folder | DomainError] = {}
        kept: list[tuple[Recorded, dict[str, Any]]] = []
        recorded = self.runs if only is None else only
        refused = claim_ids(session, "run", [rec.run_id for rec in recorded if rec.run is not None])
        for rec in recorded:
            outcome[rec.name] = rec.error
            if rec.run is None:
                continue
            try:
                meta = runs.checked_meta(rec.run, rec.run_id)
                if rec.run_id in refused:
                    raise refused[rec.run_id]
                if rec.run.folder not in folders:
                    try:
                        with session.begin_nested():
                            found = ensure_folder(session, user, rec.run.folder, rec.run.make_folder, max_folders=None)
                            blob_rules.hold(session, found.owner_id, None)  # no quota here: the bound is forgotten
                            folders[rec.run.folder] = found
                    except DomainError as e:
                        folders[rec.run.folder] = e
                place = folders[rec.run.folder]
                if isinstance(place, DomainError):
                    raise place
            except DomainError as e:
                outcome[rec.name] = str(refusal(f"PUT /runs/{rec.run_id}", e))
                continue
            columns: dict[str, Any] = {
                "platform": {},
                "edited": [],
                "log_bytes": 0,
                "metric_points": 0,
                "metric_names": 0,
            }
            columns.update(runs.meta_columns(meta, rec.run.platform))
            kept.append((rec, {"id": rec.run_id, "folder_id": place.id, "owner_id": place.owner_id, **columns}))
        if kept:  # one INSERT for the batch, without the ORM's objects: 2-3x less CPU for thousands of runs
            table: Table = Run.__table__  # type: ignore[assignment]
            session.connection().execute(insert(table), [values for _, values in kept])
        sending = [rec for rec, _ in kept if rec.requests]
        loaded: dict[str, Run] = {}
        for at in range(0, len(sending), 500):  # the rows the runs' other requests need (their keys, counters)
            ids = [rec.run_id for rec in sending[at : at + 500]]
            loaded.update({run.id: run for run in session.scalars(select(Run).where(Run.id.in_(ids)))})
        rows = _Rows(settings.max_batch_points)
        for rec in sending:
            run = loaded[rec.run_id]
            ends: dict[str, int] = {}
            texts: list[str] = []
            for request, stream, batch in rec.requests:
                try:
                    moved = rows.add(run, batch, texts)
                except DomainError as e:
                    outcome[rec.name] = str(refusal(request, e))
                    break
                if moved:
                    ends[stream] = batch.end
            rows.cursors += [{"node_kind": "run", "node_id": run.id, "stream": s, "offset": e} for s, e in ends.items()]
            if texts:
                rows.output += logs.pieces(run.pk, "".join(texts), 0, 0)
                run.log_bytes = rows.output[-1]["end"]
        rows.insert(session)
        return outcome


@dataclass
class _Rows:
    """The rows a batch of new runs adds, built as :class:`Uploads` builds them, inserted together."""

    max_points: int
    points: dict[tuple[int, str], list[tuple[Any, ...]]] = field(default_factory=dict)
    runs: dict[int, Run] = field(default_factory=dict)
    cursors: list[dict[str, Any]] = field(default_factory=list)
    output: list[dict[str, Any]] = field(default_factory=list)
    lineage: list[dict[str, Any]] = field(default_factory=list)
    pictures: list[dict[str, Any]] = field(default_factory=list)

    def add(self, run: Run, batch: Batch, texts: list[str]) -> bool:
        """Add the rows of one body of a new run; whether it moves its cursor."""
        if isinstance(batch, MetricBatch):
            found = ingest.metric_rows(run.pk, batch.type, batch.columns(), self.max_points)
            self.points.setdefault((run.pk, batch.type), []).extend(found)
            self.runs[run.pk] = run
        elif isinstance(batch, LogChunkIn):
            if batch.end <= batch.start or not batch.text:
                return False  # as logs.store_log: nothing stored, the cursor stays
            texts.append(batch.text)
        elif isinstance(batch, ImagesBatch):
            self.pictures.extend(run_images.image_rows(run.pk, batch.images))
        else:
            self.lineage.extend(edges.edge_rows("run", run.id, batch.edges))
        return True

    def insert(self, session: Session) -> None:
        for (pk, type_), found in self.points.items():
            run = self.runs[pk]  # new: every point and metric stored here is one more on its counters
            run.metric_points += ingest.insert_points(session, found) if found else 0
            run.metric_names += len({row[3] for row in found})
            ingest.summarize(session, pk, type_, None, 0)
        ingest.insert_ignore(session, Cursor, self.cursors, ["node_kind", "node_id", "stream"])
        ingest.insert_ignore(session, LogPiece, self.output, ["run_pk", "start"])
        ingest.insert_ignore(session, Edge, self.lineage, ["source_kind", "source_id", "target_kind", "target_id"])
        ingest.insert_ignore(session, RunImage, self.pictures, ["run_pk", "name", "step"])
        session.flush()


__all__ = ["NewRuns", "Recorded", "Uploads", "decoded", "refusal"]
