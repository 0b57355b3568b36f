"""The upload protocol: what a local store sends of a run or an artifact, whoever receives it.

A run travels as it is stored (see ``docs/tracking.md``): ``run.json`` and ``platform.json``
whole (:meth:`Receiver.put_run`), then each append-only file from the byte cursor the receiver
reports, in batches of complete lines: ``metrics/<type>.jsonl`` (:meth:`~Receiver.put_metrics`),
``stdout.log`` (:meth:`~Receiver.put_log`), ``lineage.jsonl`` (:meth:`~Receiver.put_lineage`),
``images.jsonl`` with its PNGs (:meth:`~Receiver.put_images`). Each batch names the byte range
it holds; the receiver stores it and moves that file's cursor together, and answers the new
cursor, so an upload cut off anywhere completes on retry with nothing missing and nothing
twice. An artifact travels as content-addressed blobs (only those the receiver lacks,
:meth:`~Receiver.missing_blobs`, :meth:`~Receiver.put_blob`), then its metadata
(:meth:`~Receiver.put_artifact`) and its lineage.

:func:`ember.track.client.upload_run` and :func:`~ember.track.client.upload_artifact` read a
local folder and send it to any receiver. The receivers (as MLflow keeps one ``AbstractStore``
behind its REST, SQL and file stores):

- :class:`ember.track.client.Client`: over HTTP, to an ember server's ``/api/v1``;
- :class:`ember.server.services.upload.Uploads`: the server's own, in process, on a database
  session; the API's routes call it, and so does ``ember ui``'s index;
- :class:`ember.server.services.upload.NewRuns`: batched, for runs the database does not hold
  yet: it keeps what each call would store and writes many runs with a few statements.

The bodies are the JSON the HTTP API takes (``docs/server.md``); a receiver that refuses one
raises :class:`ember.errors.TrackingError` (the client's ``UploadError``) naming the request and
why, and keeps nothing of it.

Example:
    >>> from ember.track.client import Client, upload_run
    >>> with Client() as receiver:            # or the server's Uploads(session, user, limits)
    ...     upload_run(run.path, client=receiver)
"""

from __future__ import annotations

from typing import IO, Any, Literal, Protocol, TypedDict

NodeKind = Literal["run", "artifact"]
Conflict = Literal["new", "skip", "error", "replace"]


class Placement(TypedDict):
    """Where a new node goes, and what to do when its folder holds another of that name."""

    folder: str
    make_folder: bool
    conflict_strategy: Conflict


class RunBody(Placement):
    """``run.json`` and ``platform.json`` as read, with their :class:`Placement`."""

    run: dict[str, Any]
    platform: dict[str, Any]


class ArtifactBody(Placement):
    """``artifact.json``'s id, name, labels, description, created, files and references."""

    artifact: dict[str, Any]


class Answer(TypedDict):
    """What a receiver says of a node put: its id, ``created``/``updated``/``skipped``..., its
    folder, and the cursor of each file it holds (``{"metrics/train.jsonl": 4096, ...}``)."""

    id: str
    action: str
    folder: str
    cursors: dict[str, int]


class MetricColumns(TypedDict):
    """Complete lines of ``metrics/<type>.jsonl`` from byte ``start`` to ``end``, as columns: one
    ``step``, ``epoch``, ``time`` per line; per metric a value per line (``None``: not on that line;
    NaN and infinities as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``)."""

    type: str
    start: int
    end: int
    step: list[int]
    epoch: list[float | None]
    time: list[float]
    metrics: dict[str, list[float | str | None]]


class LogText(TypedDict):
    """The text of ``stdout.log`` from byte ``start`` to ``end`` (decoded as UTF-8)."""

    start: int
    end: int
    text: str


class LineageLines(TypedDict):
    """Complete lines of a node's ``lineage.jsonl`` from byte ``start`` to ``end``, one edge each."""

    start: int
    end: int
    edges: list[dict[str, Any]]


class ImageLine(TypedDict):
    """One line of ``images.jsonl`` with its PNG, base64-encoded."""

    name: str
    step: int
    time: float
    png: str


class ImageLines(TypedDict):
    """Complete lines of ``images.jsonl`` from byte ``start`` to ``end``, with their PNGs."""

    start: int
    end: int
    images: list[ImageLine]


class RunReceiver(Protocol):
    """What receives a run: its metadata, then each append-only file from its cursor."""

    def put_run(self, run_id: str, body: RunBody) -> Answer:
        """Create or update the run ``run_id`` (the same run is continued in place).

        Returns:
            The run's :class:`Answer`: where it is and the cursors to continue each file from
            (``action == "skipped"``: its folder holds another run of that name, nothing more
            is sent).
        """
        ...

    def put_metrics(self, run_id: str, batch: MetricColumns) -> int:
        """Store a batch of ``metrics/<type>.jsonl``; the file's cursor after it."""
        ...

    def put_log(self, run_id: str, chunk: LogText) -> int:
        """Store text of ``stdout.log``; the file's cursor after it."""
        ...

    def put_lineage(self, kind: NodeKind, node_id: str, lines: LineageLines) -> int:
        """Store lines of a run's or artifact's ``lineage.jsonl``; the file's cursor after them."""
        ...

    def put_images(self, run_id: str, batch: ImageLines) -> int:
        """Store lines of ``images.jsonl`` with their PNGs; the file's cursor after them."""
        ...


class Receiver(RunReceiver, Protocol):
    """What receives runs and artifacts (see the module)."""

    def missing_blobs(self, digests: list[str]) -> set[str]:
        """Which of these sha256 digests the uploader has not uploaded yet (send only those)."""
        ...

    def put_blob(self, sha256: str, file: IO[bytes]) -> None:
        """Store one file's bytes (read from ``file``'s position); refused unless they hash to ``sha256``."""
        ...

    def put_artifact(self, artifact_id: str, body: ArtifactBody) -> Answer:
        """Create or update the artifact ``artifact_id``; every file's blob is put first."""
        ...


__all__ = [
    "Answer",
    "ArtifactBody",
    "ImageLine",
    "ImageLines",
    "LineageLines",
    "LogText",
    "MetricColumns",
    "NodeKind",
    "Placement",
    "Receiver",
    "RunBody",
    "RunReceiver",
]
