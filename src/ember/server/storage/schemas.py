"""Request bodies of the REST API (pydantic models; they are also the OpenAPI schema)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

Count = Annotated[int, Strict(), Field(ge=0, le=2**62)]
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
"""A finite float: NaN and infinities travel as the strings of :data:`Value`, nowhere else."""
Value = Number | Literal["NaN", "Infinity", "-Infinity"]
MetricName = Annotated[str, Field(min_length=1, max_length=200)]
Conflict = Literal["new", "skip", "error", "replace"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PointIn(_Strict):
    """One line of ``metrics/<type>.jsonl``: NaN and infinities as the strings the store writes."""

    step: Count
    epoch: Number | None = None
    time: Number
    metrics: dict[MetricName, Value]


@dataclass(frozen=True)
class Columns:
    """A batch's lines as columns: ``step``, ``epoch``, ``time`` per line; per metric, a value per line.

    ``None`` in a metric's column means that line has no such metric.
    """

    step: list[int]
    epoch: list[float | None]
    time: list[float]
    metrics: dict[str, list[float | str | None]]


class MetricBatch(_Strict):
    """Complete lines of a metrics file, from byte ``start`` to byte ``end`` of it.

    The lines come in one of two forms. ``points``: one object per line, as the file holds it.
    Columns (what ``ember.track`` sends; validated as whole arrays, many times faster): ``step``,
    ``epoch`` and ``time`` hold one entry per line, and ``metrics`` maps each metric name to one
    value per line, ``null`` where a line has no such metric::

        {"type": "train", "start": 0, "end": 160, "step": [0, 1], "epoch": [null, null],
         "time": [1716200000.1, 1716200000.2], "metrics": {"loss": [0.9, "NaN"], "acc": [null, 0.5]}}
    """

    type: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    start: Count
    end: Count
    points: list[PointIn] | None = None
    step: list[Count] | None = None
    epoch: list[Number | None] | None = None
    time: list[Number] | None = None
    metrics: dict[MetricName, list[Value | None]] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> MetricBatch:
        columns = (self.step, self.epoch, self.time, self.metrics)
        if self.points is not None:
            if any(c is not None for c in columns):
                raise ValueError("send either points or the columns step, epoch, time and metrics, not both")
            return self
        if any(c is None for c in columns):
            raise ValueError("send either points or all of the columns step, epoch, time and metrics")
        lines = len(self.step)  # type: ignore[arg-type]
        lengths = {"epoch": len(self.epoch), "time": len(self.time)}  # type: ignore[arg-type]
        lengths.update({f"metrics[{name!r}]": len(v) for name, v in self.metrics.items()})  # type: ignore[union-attr]
        wrong = [f"{k} has {n}" for k, n in lengths.items() if n != lines]
        if wrong:
            raise ValueError(f"every column needs one entry per line ({lines} steps): {', '.join(wrong[:5])}")
        return self

    def columns(self) -> Columns:
        """The lines as :class:`Columns`, whichever form they came in."""
        if self.points is None:
            return Columns(self.step, self.epoch, self.time, self.metrics)  # type: ignore[arg-type]
        points = self.points
        names = dict.fromkeys(name for p in points for name in p.metrics)
        return Columns(
            [p.step for p in points],
            [p.epoch for p in points],
            [p.time for p in points],
            {name: [p.metrics.get(name) for p in points] for name in names},
        )


class LogChunkIn(_Strict):
    """Text of ``stdout.log`` from byte ``start`` to byte ``end`` of the file (decoded as UTF-8).

    At most 4 Mi characters (ember's client sends at most 512 KiB of the file at once; before issue
    30, 4 MiB), and at most :data:`ember.server.services.codec.MAX_BACKSLASHES` backslashes in the body.
    """

    start: Count
    end: Count
    text: Annotated[str, Field(max_length=4 << 20)]


class NodeRef(BaseModel):
    """One end of a lineage edge, as ``lineage.jsonl`` writes it (its ``path`` is ignored)."""

    kind: Literal["run", "artifact"]
    id: str
    name: Annotated[str, Field(max_length=200)]


class EdgeIn(BaseModel):
    """One line of ``lineage.jsonl``."""

    time: Number
    source: NodeRef
    target: NodeRef


class LineageBatch(_Strict):
    """Complete lines of a node's ``lineage.jsonl`` from byte ``start`` to byte ``end``."""

    start: Count
    end: Count
    edges: list[EdgeIn]


class Placement(_Strict):
    """Where a new node goes and what to do when the folder already holds one of that name."""

    folder: str = "default"
    make_folder: bool = False
    conflict_strategy: Conflict = "new"


class RunIn(Placement):
    """A run's ``run.json`` and ``platform.json``, sent whole."""

    run: dict[str, Any]
    platform: dict[str, Any] = Field(default_factory=dict)


class RunEdit(_Strict):
    """A change to a run's name, labels or description (``PATCH /runs/{id}``): the fields given
    are set, the others kept. ``labels`` replaces the whole list."""

    name: str | None = Field(default=None, max_length=100)
    labels: list[str] | None = Field(default=None, max_length=1000)
    description: str | None = Field(default=None, max_length=100_000)


class FileIn(_Strict):
    """One file of an artifact (its bytes are uploaded as a blob first)."""

    path: str
    size: Count
    sha256: str


class ReferenceIn(_Strict):
    """A reference to data kept elsewhere."""

    uri: Annotated[str, Field(min_length=1, max_length=4096)]
    path: str


class ArtifactMeta(BaseModel):
    """The parts of ``artifact.json`` the server keeps (others, such as ``source``, are dropped).

    Bounded, as every list a request can grow: at most 1,000 labels, 100,000 files and 10,000
    references (422 above).
    """

    id: str
    name: str
    labels: Annotated[list[Annotated[str, Field(max_length=200)]], Field(max_length=1_000)] = Field(
        default_factory=list
    )
    description: Annotated[str, Field(max_length=100_000)] = ""
    created: Annotated[str, Field(max_length=40)] | None = None
    files: Annotated[list[FileIn], Field(max_length=100_000)] = Field(default_factory=list)
    references: Annotated[list[ReferenceIn], Field(max_length=10_000)] = Field(default_factory=list)


class ArtifactIn(Placement):
    """An artifact's metadata and file list."""

    artifact: ArtifactMeta


class BlobQuery(_Strict):
    """Digests the client means to upload."""

    sha256: Annotated[list[str], Field(max_length=100_000)]


class FolderIn(_Strict):
    """A folder to create."""

    path: str
    parents: bool = False


class ShareIn(_Strict):
    """A grant: ``target`` is a folder path (kind folder) or a run/artifact id."""

    kind: Literal["folder", "run", "artifact"]
    target: str
    grantee: str
    level: Literal["view", "edit", "none"]


class KeyIn(_Strict):
    """A new API key for the caller."""

    label: Annotated[str, Field(max_length=100)] = ""
    expires_days: Annotated[float, Field(gt=0, le=36500)] | None = None


class UserIn(_Strict):
    """A new user (admins only)."""

    name: str
    admin: bool = False


class RunRow(BaseModel):
    """One row of the runs table; ``metrics`` maps ``type/name`` to its last, best, min and max value;
    ``hparams`` are flattened (``{"opt": {"lr": 1}}`` as ``{"opt.lr": 1}``).

    ``reason`` says why a run ended Failed or Preempted (run.json's ``reason``), or why it is listed
    ``Damaged`` (``ember ui``: a run folder ember could not have written).
    """

    id: str
    name: str
    folder: str
    status: str
    start_time: str | None
    end_time: str | None
    duration: float | None
    labels: list[str]
    hparams: dict[str, Any]
    metrics: dict[str, dict[str, float | None]]
    reason: str | None = None


class RunPageOut(BaseModel):
    """A page of ``GET /api/v1/search/runs``: ``total`` runs match.

    ``hparam_keys``/``metric_keys`` are the columns the console shows by default (the hparams that
    vary across the page's runs, flattened as ``opt.lr``; the first metrics), ``*_choices`` every
    column the page's runs have, and ``metric_modes`` whether a metric's best is its ``min`` or
    ``max``: the mode most of the page's runs recorded (``run.json``'s ``metric_modes``), else by
    the metric's name (:mod:`ember.track.best`); each row's ``best`` follows it.
    """

    total: int
    page: int
    per_page: int
    runs: list[RunRow]
    hparam_keys: list[str]
    metric_keys: list[str]
    hparam_choices: list[str]
    metric_choices: list[str]
    metric_modes: dict[str, str]
