"""``Run``: one tracked training job in the local store, and its no-op twin for other ranks."""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from pathlib import Path
from time import time as _time
from types import TracebackType
from typing import Any

from ember.errors import TrackingError, describe, short_repr
from ember.track import _live, lineage
from ember.track._fs import (
    check_description,
    check_labels,
    check_name,
    drop_torn_tail,
    hostname,
    lock_folder,
    make_unique_dir,
    now_iso,
    read_json,
    unlock_folder,
    write_json_atomic,
)
from ember.track._record import Record
from ember.track._values import Point, check_epoch, check_step, coerce_metrics, normalize_type
from ember.track._writer import FLUSH_INTERVAL_S, WAKE_AT, ConsoleTee, Writer
from ember.track.artifact import Artifact
from ember.track.best import MODES_KEY, Mode, check_mode, metric_key
from ember.track.environment import collect_all
from ember.track.hparams import HParams
from ember.track.store import (
    HEARTBEAT_INTERVAL_S,
    PLATFORM_FILE,
    RUN_FILE,
    effective_status,
    metric_types,
    read_metrics,
    run_info,
)

FINAL_STATUSES = ("Complete", "Failed", "Interrupted", "Preempted")
"""How a run can end: Preempted is "stopped by a signal after saving: run again to resume"."""
_REASON_CHARS = 2000


def new_meta(name: str, folder: str, labels: list[str], description: str, hparams: dict[str, Any]) -> dict[str, Any]:
    """The ``run.json`` of a run that starts now in this process, from checked arguments (no id yet)."""
    now = now_iso()
    return {
        "format": "ember.run/1",
        "id": "",
        "name": name,
        "folder": folder,
        "labels": labels,
        "description": description,
        "status": "Running",
        "start_time": now,
        "end_time": None,
        "heartbeat": now,
        "pid": os.getpid(),
        "hostname": hostname(),
        "hparams": hparams,
        "resumes": [],
    }


def _check_finish(status: object, reason: object) -> None:
    if status not in FINAL_STATUSES:
        raise TrackingError(f"finish(status={short_repr(status)}): use one of {FINAL_STATUSES}")
    if reason is not None and not isinstance(reason, str):
        raise TrackingError(f"finish(reason=...) must be a str or None, got {describe(reason)}")


class Run(Record):
    """A tracked run: hyper-parameters, metrics, console output and lineage in one folder.

    Get one from :func:`ember.track.create_run` or :func:`ember.track.load_run`; on ranks
    other than 0 those return a :class:`NoOpRun` with the same API.

    Example:
        >>> run = track.create_run(name="mnist", hparams={"lr": 1e-3})
        >>> run.log(type="train", metrics={"loss": 0.31}, step=500, epoch=1)
        >>> run.finish()
        >>> with track.create_run(name="mnist") as run:   # Failed if the block raises
        ...     run.log("val", {"acc": 0.97}, step=500)
    """

    kind = "run"

    def __init__(self, path: Path | None, meta: dict[str, Any], writable: bool) -> None:
        super().__init__(path, meta)
        self._lock = threading.RLock()
        self._state = "open" if writable else "read-only"
        self._hparams = HParams(meta["hparams"], self._save, self._check_open, self._lock)
        self._writer: Writer | None = None
        self._tee: ConsoleTee | None = None
        self._edges: set[tuple[str, str]] = set()
        self._last_beat = 0.0
        self._uploader: Any = None  # an ember.track.client.AutoUploader with auto_upload=True
        self._folder_lock: int | None = None  # _fs.lock_folder's descriptor while open for writing

    def __repr__(self) -> str:
        return f"Run(name={self.name!r}, status={self.status!r}, path={str(self._path)!r})"

    # -- where a run comes from --------------------------------------------------------------
    @classmethod
    def create(cls, runs_dir: Path, meta: dict[str, Any], upload: dict[str, Any] | None = None) -> Run:
        """Start a new run in a folder of its own under ``runs_dir``, open for writing.

        Holds the folder's lock until :meth:`finish`, records the platform, writes ``run.json``
        and starts the writer thread and the console tee (:func:`ember.track.create_run` checks
        the arguments and calls this on rank 0).

        Args:
            runs_dir: the store's ``runs/`` folder.
            meta: the new ``run.json`` (:func:`new_meta`); its id is given here.
            upload: with auto-upload, the placement on the server: ``folder``, ``make_folder``,
                ``conflict_strategy`` (see :class:`ember.track.client.AutoUploader`).

        Returns:
            The open run.

        Example:
            >>> run = Run.create(home / "runs", new_meta("mnist", "default", [], "", {}))
        """
        path = make_unique_dir(runs_dir, meta["name"])
        run = cls(path, meta, writable=True)
        run._folder_lock = lock_folder(path, f"run {path.name}", lambda: "")  # a new folder: nobody else holds it
        (path / "metrics").mkdir()
        (path / "stdout.log").touch()
        meta["id"] = uuid.uuid4().hex
        write_json_atomic(path / PLATFORM_FILE, collect_all())
        run._start({}, upload)
        return run

    @classmethod
    def load(cls, folder: Path) -> Run:
        """The run in ``folder``, read-only (:func:`ember.track.load_run` resolves the folder).

        Raises:
            TrackingError: ``run.json`` is missing or damaged.
        """
        return cls(folder, _read_meta(folder), writable=False)

    @classmethod
    def reopen(cls, folder: Path) -> Run:
        """Continue the run in ``folder``: take its lock, cut what a crash tore off, open it.

        The status goes back to Running, the resume is noted in ``run.json``, the metric files
        are appended to and the lineage already recorded is not written twice.

        Raises:
            TrackingError: the run is open in this process, another process holds its lock or
                runs it (Running in a live process), or ``run.json`` is damaged.

        Example:
            >>> run = Run.reopen(Path(".ember/runs/mnist_240520_101500_a1b2c3"))
        """
        if _live.is_open(folder):
            raise TrackingError(f"run {folder} is already open in this process; use that Run")
        folder_lock = lock_folder(folder, f"run {folder.name} ({folder})", lambda: _writer_of(folder))
        try:  # under the lock: what is read now no other process changes until finish()
            meta = _read_meta(folder)
            if effective_status(meta) == "Running":
                raise TrackingError(
                    f"run {folder} is still Running in pid {meta.get('pid')} on {meta.get('hostname')}; "
                    "finish it there first (a dead process shows as Crashed and can be resumed)"
                )
            last_steps = _repair_for_appending(folder)
        except BaseException:
            unlock_folder(folder_lock)
            raise
        now = now_iso()
        meta.update(status="Running", reason=None, end_time=None, heartbeat=now, pid=os.getpid(), hostname=hostname())
        meta.setdefault("resumes", []).append(
            {"time": now, "pid": os.getpid(), "hostname": hostname(), "argv": sys.argv}
        )
        run = cls(folder, meta, writable=True)
        run._folder_lock = folder_lock
        run._edges = {(e["source"]["id"], e["target"]["id"]) for e in lineage.read_edges(folder)}
        run._start(last_steps, None)
        return run

    def _start(self, last_steps: dict[str, int], upload: dict[str, Any] | None) -> None:
        """Write ``run.json``, start the writer thread and the console tee (and the auto-upload).

        ``last_steps`` are the steps already on disk. A ``run.json`` that cannot be written
        releases the folder's lock: the run was never opened.
        """
        assert self._path is not None
        try:
            self._save()
        except BaseException:
            unlock_folder(self._folder_lock)
            self._folder_lock = None
            raise
        self._writer = Writer(self._path, self._heartbeat, FLUSH_INTERVAL_S, last_steps)
        self._tee = ConsoleTee(self._writer.sink)
        _live.register(self)
        if upload is not None:
            from ember.track.client import AutoUploader

            self._uploader = AutoUploader(self._path, upload)

    # -- identity and metadata (id, name, path, active: Record's) ----------------------------
    @property
    def folder(self) -> str:
        """The console folder the run is filed under when uploaded ('default')."""
        return str(self._meta["folder"])

    @property
    def hparams(self) -> HParams:
        """Hyper-parameters, dict-like; ``run.hparams.update(new, override=True)``."""
        return self._hparams

    @property
    def labels(self) -> list[str]:
        """The labels (a copy; assign a new list to change them)."""
        return list(self._meta["labels"])

    @labels.setter
    def labels(self, value: list[str]) -> None:
        checked = check_labels(value)
        self._check_open()
        with self._lock:
            self._meta["labels"] = checked
            self._save()

    @property
    def description(self) -> str:
        """Free text about the run (assignable)."""
        return str(self._meta["description"])

    @description.setter
    def description(self, value: str) -> None:
        checked = check_description(value)
        self._check_open()
        with self._lock:
            self._meta["description"] = checked
            self._save()

    @property
    def status(self) -> str:
        """Running, Complete, Failed, Interrupted or Preempted (as written in run.json)."""
        return str(self._meta["status"])

    @property
    def reason(self) -> str | None:
        """Why the run ended with its status (the error, the signal), or None."""
        return self._text_or_none("reason")

    @property
    def start_time(self) -> str:
        """When the run was created, ISO 8601 UTC."""
        return str(self._meta["start_time"])

    @property
    def end_time(self) -> str | None:
        """When it was finished, ISO 8601 UTC; None while running."""
        return self._text_or_none("end_time")

    def _text_or_none(self, key: str) -> str | None:
        value = self._meta.get(key)
        return None if value is None else str(value)

    @property
    def platform(self) -> dict[str, Any]:
        """What ``platform.json`` recorded: ``platform``, ``git`` and ``command``."""
        return read_json(self._path / PLATFORM_FILE, follow_links=False) if self._path is not None else {}

    # -- writing ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._state == "open":
            return
        if self._state == "read-only":
            how = "it was loaded read-only; reopen it with track.load_run(path, resume=True)"
        elif self._state == "forked":
            how = "this is a forked child of the process that owns it; log from that process"
        else:
            how = "it is finished; reopen it with track.load_run(path, resume=True)"
        raise TrackingError(f"run {self.name!r} ({self._path}) cannot be changed: {how}")

    def _save(self) -> None:
        if self._path is None:
            return
        with self._lock:
            write_json_atomic(self._path / RUN_FILE, self._meta)

    def _heartbeat(self) -> None:
        """Called by the writer thread after each flush."""
        now = time.monotonic()
        if now - self._last_beat < HEARTBEAT_INTERVAL_S or self._state != "open":
            return
        self._last_beat = now
        with self._lock:
            self._meta["heartbeat"] = now_iso()
            try:
                self._save()
            except OSError as e:
                if self._writer is not None:
                    self._writer.error = f"updating {self._path}/{RUN_FILE} failed: {e}"

    def _raise_writer_error(self) -> None:
        writer = self._writer
        if writer is not None and writer.error is not None:
            message, writer.error = writer.error, writer.stopped  # a dead writer keeps saying so
            raise TrackingError(message)

    def log(
        self,
        type: str,
        metrics: dict[str, Any],
        step: int,
        epoch: int | float | None = None,
    ) -> None:
        """Record metric values at a step. Cheap: the values are written in the background.

        Args:
            type: train/training, val/validate/validation, test/testing/eval/evaluate/
                evaluation (stored as train, val, test) or a custom name such as 'system'.
            metrics: name -> Python number, NumPy scalar or one-element tensor (read with
                ``.item()``, the only device sync). NaN and infinities are kept.
            step: a non-negative int, e.g. the global optimizer step.
            epoch: optional epoch number.

        Raises:
            TrackingError: a bad type, name, value, step or epoch (nothing is recorded and the
                run stays usable), or the run is not open.

        Example:
            >>> run.log("train", {"loss": loss, "lr": 1e-3}, step=500, epoch=1)
        """
        type_ = normalize_type(type)
        metrics = coerce_metrics(metrics, copy=False)  # put() copies the values into the queue at once
        step = check_step(step)
        if epoch is not None:
            epoch = check_epoch(epoch)
        writer = self._writer
        if writer is None or writer.error is not None:
            self._check_open()
            self._raise_writer_error()
            raise AssertionError("unreachable: an open run without error has a writer")
        if writer.pending.put(type_, step, epoch, _time(), metrics) >= WAKE_AT:
            writer.wake()

    def define_metric(self, name: str, mode: Mode) -> None:
        """Record which way a metric is better, so that its "best" is not guessed from its name.

        Kept in ``run.json`` (``metric_modes``), so a resumed or uploaded run keeps it; ``ember
        runs compare``, ``ember ui`` and the server's console then take its best as the minimum
        or the maximum (``best (min)`` in the runs table). Without it the name decides
        (:mod:`ember.track.best`: ``loss`` min, ``acc`` max, ``score_gap`` max). Calling it again
        for the same metric replaces the mode. Like W&B's ``define_metric(name, summary="min")``
        and Keras/Lightning's ``mode=``.

        Args:
            name: the metric as ``TYPE/NAME`` (``"val/acc"`` for ``run.log("val", {"acc": ...})``);
                the type's aliases are accepted (``"validation/acc"`` is stored as ``val/acc``).
            mode: ``"min"`` (lower is better) or ``"max"``.

        Raises:
            TrackingError: ``mode`` is not ``"min"`` or ``"max"``, ``name`` is not ``TYPE/NAME``,
                or the run is not open.

        Example:
            >>> run.define_metric("val/score_gap", mode="min")   # a gap: smaller is better
            >>> run.log("val", {"score_gap": 0.12}, step=500)
        """
        key = metric_key(name)
        checked = check_mode(mode, f"define_metric({short_repr(name)}, mode=...)")
        self._check_open()
        with self._lock:
            modes = self._meta.get(MODES_KEY)
            self._meta[MODES_KEY] = {**(modes if isinstance(modes, dict) else {}), key: checked}
            self._save()

    def last_step(self, type: str) -> int | None:
        """The highest step logged for a metric type (queued points included), or None.

        A resumed job uses it not to log a step twice: skip every step ``<= last_step``.

        Example:
            >>> run = track.load_run(path, resume=True)
            >>> done = run.last_step("train")
            >>> if done is None or step > done:
            ...     run.log("train", {"loss": loss}, step=step)
        """
        type_ = normalize_type(type)
        if self._writer is not None:
            return self._writer.last_step(type_)
        if self._path is None:
            return None
        steps = [int(p["step"]) for p in read_metrics(self._path, type_)]
        return max(steps) if steps else None

    def metric_types(self) -> list[str]:
        """The metric types logged so far (train, val, test first)."""
        self.flush()
        return metric_types(self._path) if self._path is not None else []

    def metrics(self, type: str) -> list[Point]:
        """Every point of one type as ``{"step", "epoch", "time", "metrics"}`` dicts, in order."""
        self.flush()
        return read_metrics(self._path, normalize_type(type)) if self._path is not None else []

    def log_image(self, name: str, image: Any, step: int) -> None:
        """Store an image at a step, as PNG in the run folder (``images/<name>/<step>.png``).

        Args:
            name: e.g. ``samples`` or ``val/reconstruction`` (letters, digits, ``_ . -``, ``/``).
            image: a numpy array HxW or HxWxC (C 1, 3 or 4; uint8, or float in [0, 1]), a PIL
                image, a torch tensor CxHxW or HxWxC (read to the CPU: a device sync), or the
                path of a saved image (PNG as it is; JPEG, GIF, BMP, WebP through Pillow).
            step: a non-negative int; one image per name and step.

        Raises:
            TrackingError: a bad name, image or step, a name already logged at ``step``, a PNG
                over 16 MiB, or the run is not open.

        Example:
            >>> run.log_image("samples", generator(z).clamp(0, 1)[0], step=1000)
        """
        from ember.track import images

        step = check_step(step)
        self._check_open()
        assert self._path is not None
        with self._lock:
            images.write_image(self._path, name, image, step, _time())

    def images(self) -> list[dict[str, Any]]:
        """The images logged so far: ``{"name", "step", "time", "file", "width", "height", ...}`` each."""
        from ember.track.images import read_images

        return read_images(self._path)

    def lineage(self) -> list[dict[str, Any]]:
        """The lineage edges this run takes part in (see :mod:`ember.track.lineage`)."""
        return lineage.read_edges(self._path) if self._path is not None else []

    def flush(self) -> None:
        """Write every queued point and console line now (no fsync)."""
        if self._writer is not None:
            self._writer.flush()
            self._raise_writer_error()

    def mark_input(self, x: Artifact | Run) -> None:
        """Record that this run consumed ``x`` (an artifact or another run).

        Example:
            >>> run.mark_input(track.load_artifact("mnist-data"))
        """
        self._mark(x, as_input=True)

    def mark_output(self, x: Artifact | Run) -> None:
        """Record that this run produced ``x`` (an artifact or another run).

        Example:
            >>> art = track.create_artifact("mnist-model"); art.add_file("model.pt")
            >>> run.mark_output(art)
        """
        self._mark(x, as_input=False)

    def _check_mark(self, x: object, as_input: bool) -> None:
        verb = "mark_input" if as_input else "mark_output"
        if not isinstance(x, (Artifact, Run)):
            raise TrackingError(
                f"{verb} takes an Artifact or a Run, got {type(x).__name__}; e.g. "
                f"run.{verb}(track.create_artifact('model'))"
            )
        if x is self:
            raise TrackingError(f"{verb}: a run cannot be linked to itself")

    def _mark(self, x: Artifact | Run, as_input: bool) -> None:
        self._check_mark(x, as_input)
        if not x.active or x.path is None:
            raise TrackingError(f"{x!r} is a no-op (made on a rank other than 0) and cannot be linked to a run")
        self._check_open()
        source, target = (x, self) if as_input else (self, x)
        key = (source.id, target.id)
        if key not in self._edges:
            lineage.record_edge(source, target)
            self._edges.add(key)

    def finish(self, status: str = "Complete", reason: str | None = None) -> None:
        """Flush, stop the console capture and write the final status. A second call does nothing.

        Stopping the capture puts back ``sys.stdout``/``sys.stderr`` and the ``logging``
        handlers that were writing through the run's tee (``docs/tracking.md``, console output).

        Args:
            status: Complete, Failed, Interrupted or Preempted (stopped by a signal after its
                state was saved: running the job again resumes it).
            reason: why it ended so (the error, the signal), kept in ``run.json`` as ``reason``.

        Example:
            >>> run.finish("Failed", reason="ValueError: loss is nan at step 12")
        """
        _check_finish(status, reason)
        if self._state == "finished":
            return
        self._check_open()
        _live.unregister(self)
        tee, self._tee = self._tee, None
        if tee is not None:
            tee.remove()
        writer, self._writer = self._writer, None
        self._state = "finished"
        try:
            if writer is not None:
                writer.close()  # outside the lock: the writer thread takes it for the heartbeat
            with self._lock:
                self._meta["status"] = status
                self._meta["reason"] = None if reason is None else reason[:_REASON_CHARS]
                self._meta["end_time"] = now_iso()
                self._meta["heartbeat"] = self._meta["end_time"]
                self._save()
        finally:  # finished even when the last write failed: another process may resume it
            unlock_folder(self._folder_lock)
            self._folder_lock = None
        uploader, self._uploader = self._uploader, None
        if uploader is not None:
            uploader.close()  # one last upload; a failure is logged, the local copy stays whole
        if writer is not None and writer.error is not None:
            raise TrackingError(writer.error)

    def upload(
        self, folder: str | None = None, make_folder: bool = False, conflict_strategy: str = "new"
    ) -> dict[str, Any]:
        """Upload the run (and the artifacts it is linked to) to the server you logged in to.

        Resumable and idempotent: only what the server lacks is sent, so calling it again, or
        after an upload was cut off, completes the run there without duplicates.

        Args:
            folder: the server folder; relative means under your home; default ``run.folder``.
            make_folder: create the folder (and its parents) when missing.
            conflict_strategy: for another run of the same name there: new, skip, error, replace.

        Returns:
            ``{"id", "action", "folder", "cursors"}`` as the server reports them.

        Raises:
            ember.track.client.UploadError: not logged in, the server refused, or it is unreachable.

        Example:
            >>> track.login(host="http://127.0.0.1:8765", api_key="ember_...")
            >>> run.upload(folder="examples", make_folder=True)
        """
        from ember.track.client import upload_run

        self.flush()
        assert self._path is not None
        return upload_run(self._path, folder, make_folder, conflict_strategy)

    def _forget_after_fork(self) -> None:
        self._lock = threading.RLock()
        self._hparams._lock = self._lock
        if self._writer is not None:
            self._writer.forget_after_fork()
        self._writer = None
        unlock_folder(self._folder_lock, release=False)  # the parent still writes the run
        self._folder_lock = None
        self._state = "forked"

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._state == "open":
            self._end(exc)

    def _end(self, exc: BaseException | None) -> None:
        """Finish with the status that ``exc`` (the exception ending the program or block, or None) means."""
        self.finish(*ending_status(exc))


class NoOpRun(Run):
    """The run of ranks other than 0: same API, arguments checked, nothing stored.

    Checking the arguments on every rank means a bad call raises on every rank, as on rank 0,
    instead of leaving the others waiting in a collective. Tensors are not read (no sync).
    """

    def __init__(self, meta: dict[str, Any]) -> None:
        super().__init__(None, meta, writable=True)

    @property
    def active(self) -> bool:
        return False

    def _save(self) -> None:
        return None

    def log(self, type: str, metrics: dict[str, Any], step: int, epoch: int | float | None = None) -> None:
        normalize_type(type)
        coerce_metrics(metrics, read_tensors=False)
        check_step(step)
        check_epoch(epoch)

    def last_step(self, type: str) -> int | None:
        normalize_type(type)
        return None

    def log_image(self, name: str, image: Any, step: int) -> None:
        from ember.track.images import check_name

        check_name(name)
        check_step(step)

    def _mark(self, x: Artifact | Run, as_input: bool) -> None:
        self._check_mark(x, as_input)

    def upload(
        self, folder: str | None = None, make_folder: bool = False, conflict_strategy: str = "new"
    ) -> dict[str, Any]:
        return {}

    def finish(self, status: str = "Complete", reason: str | None = None) -> None:
        _check_finish(status, reason)
        if self._state == "open":
            self._state = "finished"
            self._meta.update(status=status, reason=reason, end_time=now_iso())


def edit_run(
    folder: Path, *, name: str | None = None, labels: list[str] | None = None, description: str | None = None
) -> dict[str, Any]:
    """Change a finished run's name, labels or description in its ``run.json`` (the fields given).

    Takes the run folder's lock, so a run open in a process (which rewrites ``run.json``) is
    refused rather than edited behind its back; the folder keeps its name. The next upload
    sends the change, except for a field already edited on the server (the server's edit wins,
    see docs/tracking.md "Editing runs").

    Args:
        folder: the run's folder.
        name: the new name (the rules of ``create_run``'s).
        labels: the whole new list of labels.
        description: the new description (notes).

    Returns:
        The run.json written.

    Raises:
        TrackingError: a bad value, a damaged run, or one open or Running in another process.

    Example:
        >>> edit_run(Path(".ember/runs/mnist_240520_101500_a1b2c3"), labels=["baseline"])
    """
    checked: dict[str, Any] = {}
    if name is not None:
        checked["name"] = check_name(name, "run name")
    if labels is not None:
        checked["labels"] = check_labels(labels)
    if description is not None:
        checked["description"] = check_description(description)
    if _live.is_open(folder):
        raise TrackingError(f"run {folder} is open in this process; change it through that Run")
    folder_lock = lock_folder(folder, f"run {folder.name} ({folder})", lambda: _writer_of(folder))
    try:
        meta = _read_meta(folder)
        if effective_status(meta) == "Running":
            raise TrackingError(
                f"run {folder} is still Running in pid {meta.get('pid')} on {meta.get('hostname')}; "
                "change it when it has finished, nothing was changed"
            )
        meta.update(checked)
        write_json_atomic(folder / RUN_FILE, meta)
        return meta
    finally:
        unlock_folder(folder_lock)


def _read_meta(folder: Path) -> dict[str, Any]:
    """The run.json of the run in ``folder``; a damaged run is a TrackingError."""
    info = run_info(folder)
    if info.error is not None:
        raise TrackingError(f"run {folder} is damaged: {info.error}; move the folder out of the store or repair it")
    return info.meta


def _writer_of(folder: Path) -> str:
    """Who run.json says writes the run: 'pid N on HOST'."""
    try:
        meta = read_json(folder / RUN_FILE, follow_links=False)
    except TrackingError:
        return "run.json unreadable"
    return f"pid {meta.get('pid')} on {meta.get('hostname')}"


def _repair_for_appending(folder: Path) -> dict[str, int]:
    """Cut the lines a crash tore off the run's append-only files; return each metric type's last step."""
    (folder / "metrics").mkdir(exist_ok=True)
    last_steps: dict[str, int] = {}
    for type_ in metric_types(folder):
        drop_torn_tail(folder / "metrics" / f"{type_}.jsonl")
        steps = [int(p["step"]) for p in read_metrics(folder, type_)]
        if steps:
            last_steps[type_] = max(steps)
    drop_torn_tail(folder / lineage.LINEAGE_FILE)
    return last_steps


def ending_status(exc: BaseException | None) -> tuple[str, str | None]:
    """The status and reason of a run that an exception (or None) ends.

    ``KeyboardInterrupt``: Interrupted; ``SystemExit`` with code 0/None: Complete, with code 75
    (``EX_TEMPFAIL``, what a preempted ``fit`` exits with after saving): Preempted; anything
    else: Failed, the reason being the exception.
    """
    if exc is None:
        return "Complete", None
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, KeyboardInterrupt):
        return "Interrupted", text
    if isinstance(exc, SystemExit):
        if exc.code in (0, None):
            return "Complete", None
        if exc.code == getattr(os, "EX_TEMPFAIL", 75):
            return "Preempted", str(exc) or text
    return "Failed", text
