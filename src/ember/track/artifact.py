"""Artifacts: a folder of copied files (with size and sha256) and references to outside data.

Layout: ``<home>/artifacts/<name>_<YYMMDD>_<HHMMSS>_<6 chars>/`` holding ``artifact.json``
(metadata, the file list and the references, replaced atomically on each change), ``files/``
(the copies, each written to a temporary name and renamed) and ``lineage.jsonl``.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ember._atomic import atomic_open, why_write_failed
from ember.errors import TrackingError
from ember.track import lineage
from ember.track._fs import (
    ARTIFACTS_DIR,
    check_description,
    check_labels,
    check_name,
    check_rel_path,
    file_kind,
    get_rank,
    make_unique_dir,
    now_iso,
    read_json,
    resolve_home,
    write_json_atomic,
)
from ember.track._record import Record
from ember.track.store import resolve

ARTIFACT_FILE = "artifact.json"
FORMAT = "ember.artifact/1"


def _copy_hashed(src: Path, dest: Path) -> tuple[int, str]:
    """Copy the regular file ``src`` to ``dest`` atomically (:func:`ember._atomic.atomic_open`);
    return (size, sha256 hex). A pipe or device found there (replaced since it was checked) is
    refused without reading it."""
    fd = os.open(src, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as fin:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise TrackingError(f"{src} is {file_kind(mode)}, not a regular file: nothing of it was copied")
        dest.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        size = 0
        with atomic_open(dest, "wb") as fout:
            while chunk := fin.read(1 << 20):
                digest.update(chunk)
                fout.write(chunk)
                size += len(chunk)
    return size, digest.hexdigest()


class Artifact(Record):
    """A set of files and references produced or consumed by runs.

    Create one with :func:`create_artifact`, fill it with :meth:`add_file`, :meth:`add_dir`
    and :meth:`add_reference`, and link it with ``run.mark_output(artifact)`` or
    ``run.mark_input(artifact)``.

    Example:
        >>> art = track.create_artifact(name="mnist-model", labels=["cnn"])
        >>> art.add_file("model.pt")                       # stored as files/model.pt
        >>> art.add_reference("s3://bucket/mnist/", obj_path="data")
        >>> run.mark_output(art)
    """

    kind = "artifact"

    def __repr__(self) -> str:
        return f"Artifact(name={self.name!r}, path={str(self._path)!r})"

    @classmethod
    def create(cls, artifacts_dir: Path, meta: dict[str, Any]) -> Artifact:
        """Make a new, empty artifact in a folder of its own under ``artifacts_dir``.

        Args:
            artifacts_dir: the store's ``artifacts/`` folder.
            meta: the new ``artifact.json`` from checked arguments; its id is given here.

        Returns:
            The artifact (:func:`create_artifact` checks the arguments and calls this on rank 0).
        """
        path = make_unique_dir(artifacts_dir, meta["name"])
        meta["id"] = uuid.uuid4().hex
        (path / "files").mkdir()
        artifact = cls(path, meta)
        artifact._save()
        return artifact

    @property
    def labels(self) -> list[str]:
        """The labels (a copy)."""
        return list(self._meta["labels"])

    @property
    def description(self) -> str:
        """The description."""
        return str(self._meta["description"])

    @property
    def files(self) -> list[dict[str, Any]]:
        """One dict per stored file: ``path`` (inside ``files/``), ``size``, ``sha256``, ``source``."""
        return [dict(f) for f in self._meta["files"]]

    @property
    def references(self) -> list[dict[str, Any]]:
        """One dict per reference: ``uri`` and ``path``."""
        return [dict(r) for r in self._meta["references"]]

    def lineage(self) -> list[dict[str, Any]]:
        """The edges this artifact takes part in (see :mod:`ember.track.lineage`)."""
        return lineage.read_edges(self._path) if self._path is not None else []

    def _save(self) -> None:
        assert self._path is not None
        write_json_atomic(self._path / ARTIFACT_FILE, self._meta)

    def _check_free(self, obj_path: str) -> None:
        taken = [f["path"] for f in self._meta["files"]] + [r["path"] for r in self._meta["references"]]
        for other in taken:
            if other == obj_path or other.startswith(obj_path + "/") or obj_path.startswith(other + "/"):
                raise TrackingError(
                    f"artifact {self.name!r} already holds {other!r}, which clashes with "
                    f"obj_path {obj_path!r}; pass another obj_path"
                )

    def add_file(self, path: str | os.PathLike[str], obj_path: str | None = None) -> dict[str, Any]:
        """Copy a file into the artifact and record its size and sha256.

        Args:
            path: the file to copy.
            obj_path: where it goes inside the artifact ('weights/model.pt'); default: its
                file name.

        Returns:
            The file record: ``{"path", "size", "sha256", "source"}``.

        Raises:
            TrackingError: the file is missing or not a file, or ``obj_path`` is unsafe or
                already taken. The artifact is unchanged.
        """
        src = Path(path)
        obj = check_rel_path(src.name if obj_path is None else obj_path, "obj_path")
        if not src.is_file():
            what = "is not a file" if src.exists() else "does not exist"
            raise TrackingError(f"add_file: {src} {what}; pass the path of a file to copy")
        self._check_free(obj)
        return self._copy_in(src, obj)

    def _copy_in(self, src: Path, obj: str) -> dict[str, Any]:
        assert self._path is not None
        try:
            size, sha = _copy_hashed(src, self._path / "files" / obj)
        except OSError as e:
            raise TrackingError(f"copying {src} into artifact {self.name!r} failed: {why_write_failed(e)}") from None
        record = {"path": obj, "size": size, "sha256": sha, "source": str(src.absolute())}
        self._meta["files"].append(record)
        self._save()
        return dict(record)

    def add_dir(self, path: str | os.PathLike[str], obj_path: str | None = None) -> list[dict[str, Any]]:
        """Copy every file under a folder (following links) into the artifact.

        Only regular files are copied: a named pipe, a device, a socket or a link to nothing
        under the folder is refused, naming it, before anything is copied (reading a pipe would
        wait for a writer for ever, a device may never end), as :meth:`add_file` refuses them.

        Args:
            path: the folder to copy.
            obj_path: the folder inside the artifact; default: the folder's name.

        Returns:
            The file records, in sorted path order.

        Raises:
            TrackingError: the folder is missing, a link loops, an entry is not a regular file,
                or a target path is taken. The artifact is unchanged.
        """
        src = Path(path)
        base = check_rel_path(src.absolute().name if obj_path is None else obj_path, "obj_path")
        if not src.is_dir():
            what = "is not a folder" if src.exists() else "does not exist"
            raise TrackingError(f"add_dir: {src} {what}; pass the path of a folder to copy")
        todo: list[tuple[Path, str]] = []
        seen: set[str] = set()
        for dirpath, dirnames, filenames in os.walk(src, followlinks=True):
            real = os.path.realpath(dirpath)
            if real in seen:
                raise TrackingError(f"add_dir: {dirpath} links back to a folder already copied")
            seen.add(real)
            dirnames.sort()
            rel = Path(dirpath).relative_to(src).as_posix()
            for filename in sorted(filenames):
                file = Path(dirpath) / filename
                try:
                    mode = os.stat(file).st_mode  # through links, as the copy reads
                except FileNotFoundError:
                    raise TrackingError(f"add_dir: {file} is a link to nothing; nothing was copied") from None
                if not stat.S_ISREG(mode):
                    raise TrackingError(
                        f"add_dir: {file} is {file_kind(mode)}, not a regular file; nothing was copied. Remove it "
                        "from the folder, or add the files you want with add_file"
                    )
                obj = posixpath.normpath(posixpath.join(base, rel, filename))
                todo.append((file, check_rel_path(obj, "obj_path")))
        for _, obj in todo:
            self._check_free(obj)
        return [self._copy_in(file, obj) for file, obj in todo]

    def add_reference(self, uri: str, obj_path: str | None = None) -> dict[str, Any]:
        """Record a reference to data kept elsewhere (nothing is copied).

        Args:
            uri: where the data is, e.g. ``s3://bucket/mnist/`` or ``/data/mnist``.
            obj_path: its name inside the artifact; default: the last part of ``uri``.

        Returns:
            The reference record ``{"uri", "path"}``.
        """
        if not isinstance(uri, str) or not uri.strip():
            raise TrackingError(f"add_reference: uri must be a non-empty str, got {uri!r}")
        default = uri.rstrip("/").rsplit("/", 1)[-1].split(":")[-1]
        obj = check_rel_path(default if obj_path is None else obj_path, "obj_path")
        self._check_free(obj)
        record = {"uri": uri, "path": obj}
        self._meta["references"].append(record)
        self._save()
        return dict(record)

    def remove(self, obj_paths: Iterable[str]) -> None:
        """Remove files (by their paths inside the artifact) and their copies.

        The metadata is rewritten first, so a reader never sees a record whose copy is gone;
        folders left empty are removed too. Paths the artifact does not hold are an error.

        Example:
            >>> art.remove(["checkpoints/ckpt-e0001-s000000010.ckpt"])
        """
        gone = {check_rel_path(p, "obj_path") for p in obj_paths}
        unknown = gone - {f["path"] for f in self._meta["files"]}
        if unknown:
            raise TrackingError(f"remove: artifact {self.name!r} holds no file {sorted(unknown)}")
        assert self._path is not None
        self._meta["files"] = [f for f in self._meta["files"] if f["path"] not in gone]
        self._save()
        files = self._path / "files"
        for obj in gone:
            (files / obj).unlink(missing_ok=True)
            parent = (files / obj).parent
            while parent != files and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent

    def upload(
        self, folder: str = "default", make_folder: bool = False, conflict_strategy: str = "new"
    ) -> dict[str, Any]:
        """Upload the artifact (only the files the server lacks) and its lineage.

        Args: as for :meth:`ember.track.Run.upload`.

        Example:
            >>> art.upload(folder="models", make_folder=True)
        """
        from ember.track.client import upload_artifact

        assert self._path is not None
        return upload_artifact(self._path, folder, make_folder, conflict_strategy)


class NoOpArtifact(Artifact):
    """What ranks other than 0 get: checks arguments like :class:`Artifact`, stores nothing."""

    @property
    def active(self) -> bool:
        return False

    def add_file(self, path: str | os.PathLike[str], obj_path: str | None = None) -> dict[str, Any]:
        obj = check_rel_path(Path(path).name if obj_path is None else obj_path, "obj_path")
        return {"path": obj, "size": 0, "sha256": "", "source": str(path)}

    def add_dir(self, path: str | os.PathLike[str], obj_path: str | None = None) -> list[dict[str, Any]]:
        check_rel_path(Path(path).absolute().name if obj_path is None else obj_path, "obj_path")
        return []

    def add_reference(self, uri: str, obj_path: str | None = None) -> dict[str, Any]:
        if not isinstance(uri, str) or not uri.strip():
            raise TrackingError(f"add_reference: uri must be a non-empty str, got {uri!r}")
        return {"uri": uri, "path": obj_path or ""}

    def remove(self, obj_paths: Iterable[str]) -> None:
        for p in obj_paths:
            check_rel_path(p, "obj_path")

    def upload(
        self, folder: str = "default", make_folder: bool = False, conflict_strategy: str = "new"
    ) -> dict[str, Any]:
        return {}


def create_artifact(
    name: str,
    labels: list[str] | None = None,
    description: str = "",
    home: str | os.PathLike[str] | None = None,
) -> Artifact:
    """Create an empty artifact in the local store (a no-op one on ranks other than 0).

    Args:
        name: a name usable in a folder name (no '/', '\\', '..').
        labels: optional labels.
        description: free text.
        home: the store root; default ``$EMBER_HOME`` or ``./.ember``.

    Returns:
        The new :class:`Artifact`.

    Example:
        >>> art = track.create_artifact("mnist-model")
        >>> art.add_file("model.pt")
    """
    meta: dict[str, Any] = {
        "format": FORMAT,
        "id": "",
        "name": check_name(name),
        "labels": check_labels(labels),
        "description": check_description(description),
        "created": now_iso(),
        "files": [],
        "references": [],
    }
    if get_rank() != 0:
        return NoOpArtifact(None, meta)
    return Artifact.create(resolve_home(home) / ARTIFACTS_DIR, meta)


def load_artifact(path: str | os.PathLike[str], home: str | os.PathLike[str] | None = None) -> Artifact:
    """Open an artifact of the store: its folder path, folder name or a unique prefix of it.

    Returns:
        The :class:`Artifact`; files added to it are saved as for a new one.
    """
    folder = resolve(path, resolve_home(home), ARTIFACTS_DIR, ARTIFACT_FILE)
    meta = read_json(folder / ARTIFACT_FILE, follow_links=False)
    return Artifact(folder, meta)
