"""Uploading the local store to an ember tracking server: login, upload, auto-upload.

A run uploads as it is stored (see ``docs/tracking.md``): ``run.json`` and ``platform.json``
whole, then each append-only file (``metrics/<type>.jsonl``, ``stdout.log``, ``lineage.jsonl``)
from the byte cursor the server reports, in batches of complete lines. The server inserts
points keyed on (run, type, step, name) and moves its cursor in the same transaction, so an
upload cut off anywhere completes on retry with nothing missing and nothing twice. Artifact
files go as content-addressed blobs: the server says which digests it lacks and only those are
sent. The upload reads the local folder and sends it to a :class:`~ember.track.receiver.Receiver`
(:mod:`ember.track.receiver`, the protocol): a :class:`Client` sends it over HTTP (needs ``httpx``,
``pip install 'ember[server]'``); the server's own receiver stores it in process (``ember ui``).

Example:
    >>> from ember import track
    >>> track.login(host="http://127.0.0.1:8765", api_key="ember_...")
    >>> run.upload(folder="examples", make_folder=True)
"""

from __future__ import annotations

import codecs
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar, cast

from ember._format import format_duration
from ember.errors import TrackingError
from ember.track import images, lineage
from ember.track._fs import ARTIFACTS_DIR, RUNS_DIR, read_json
from ember.track._upload_io import UploadError, lines_from, no_follow, read_from
from ember.track.receiver import (
    Answer,
    ArtifactBody,
    ImageLines,
    LineageLines,
    LogText,
    MetricColumns,
    NodeKind,
    Placement,
    Receiver,
    RunBody,
    RunReceiver,
)
from ember.track.retry import Retry, retry_after, should_retry
from ember.track.store import read_platform

log = logging.getLogger("ember.track.client")
ENV_HOST, ENV_KEY = "EMBER_HOST", "EMBER_API_KEY"
BATCH_LINES = 20_000
"""Lines of an append-only file sent in one request at most."""
LOG_BATCH_BYTES = (
    512 << 10
)  # a request's escapes stay under the server's bound (ember.server.services.codec.MAX_BACKSLASHES)
BATCH_VALUES = 20_000  # the server's default limit of values per metrics request
CONFLICTS = ("new", "skip", "error", "replace")
DEFAULT_RETRY = Retry()
"""The retry policy of a :class:`Client` made without one: 120 s per request, backoff 0.5 s to 30 s."""


class ServerUnavailable(UploadError):
    """A request still failed at its deadline, after retries (see :class:`~ember.track.retry.Retry`).

    The message names the server, the request, how often and how long it was tried, the last
    failure, and what stays in the local store to upload again.

    Attributes:
        host: the server.
        kept: what the local store keeps, e.g. ``"the run /home/me/.ember/runs/mnist-1a2b"``.
        path: the folder to give ``ember upload`` to continue.
    """

    def __init__(self, host: str, request: str, attempts: int, elapsed: float, reason: str) -> None:
        super().__init__(host, request, attempts, elapsed, reason)
        self.host, self.request, self.attempts, self.elapsed, self.reason = host, request, attempts, elapsed, reason
        self.kept: str | None = None
        self.path: str | None = None

    def keep(self, kept: str, path: str | os.PathLike[str], replace: bool = False) -> None:
        """Say what the local store keeps (the innermost caller's word stands unless ``replace``)."""
        if self.kept is None or replace:
            self.kept, self.path = kept, str(path)

    def __str__(self) -> str:
        text = (
            f"cannot reach the tracking server {self.host}: {self.request} failed {self.attempts} time(s) in "
            f"{format_duration(self.elapsed)}, the last with {self.reason}"
        )
        if self.kept:
            text += (
                f". Nothing is lost: {self.kept} stays complete in the local store; `ember upload {self.path}` "
                "continues from where the server stopped"
            )
        return text


def credentials_path() -> Path:
    """``~/.ember/credentials`` (``$HOME`` decides where ``~`` is)."""
    return Path(os.path.expanduser("~")) / ".ember" / "credentials"


@dataclass(frozen=True)
class Credentials:
    """A server address and an API key (``repr`` hides the key)."""

    host: str
    api_key: str

    def __repr__(self) -> str:
        return f"Credentials(host={self.host!r}, api_key='***')"


def credentials(host: str | None = None, api_key: str | None = None) -> Credentials:
    """The server and key to use: arguments, else ``$EMBER_HOST``/``$EMBER_API_KEY``, else the file.

    Raises:
        UploadError: nothing says where to upload.
    """
    saved: dict[str, Any] = {}
    path = credentials_path()
    if path.is_file():
        saved = read_json(path)
    host = host or os.environ.get(ENV_HOST) or saved.get("host")
    api_key = api_key or os.environ.get(ENV_KEY) or saved.get("api_key")
    if not host or not api_key:
        raise UploadError(
            "not logged in: run `ember login --host URL` or track.login(host, api_key), "
            f"or set ${ENV_HOST} and ${ENV_KEY}"
        )
    return Credentials(str(host).rstrip("/"), str(api_key))


def login(host: str | None = None, api_key: str | None = None) -> str:
    """Check a key against a server and store both in ``~/.ember/credentials`` (mode 0600).

    Args:
        host: the server, e.g. ``http://127.0.0.1:8765``; default ``$EMBER_HOST``.
        api_key: the key; default ``$EMBER_API_KEY``.

    Returns:
        The user name the server knows the key by.

    Raises:
        UploadError: the server is unreachable or refuses the key (nothing is stored).

    Example:
        >>> track.login(host="http://127.0.0.1:8765", api_key="ember_...")
        'alice'
    """
    creds = credentials(host, api_key)
    with Client(creds, retry=Retry(deadline_s=10.0)) as client:  # a mistyped host should not wait long
        name = str(client.call("GET", "/me")["name"])
    path = credentials_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its old mode through os.open
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"host": creds.host, "api_key": creds.api_key}, f)
    return name


def logout() -> bool:
    """Forget the stored credentials; return whether there were any."""
    path = credentials_path()
    existed = path.exists()
    path.unlink(missing_ok=True)
    return existed


class Client:
    """A persistent HTTP client of ``/api/v1`` that retries; every failure is an :class:`UploadError`.

    One connection pool serves every request of an upload. A request that fails with a dropped
    or refused connection, a timeout, 429, 502/503/504 or the server's 409 with ``Retry-After``
    is sent again after an exponential backoff with jitter, until ``retry.deadline_s`` (see
    :class:`~ember.track.retry.Retry`); then :class:`ServerUnavailable`.

    Args:
        creds: the server and key; default :func:`credentials`.
        timeout: the most seconds one attempt may take (connect, send, wait for the answer).
        http: an ``httpx.Client`` to send with (tests pass a FastAPI ``TestClient``); its base
            URL is the host. Default: a new one, closed by :meth:`close`.
        retry: when to try again; default :data:`DEFAULT_RETRY`.

    Example:
        >>> with Client(retry=Retry(deadline_s=600)) as client:
        ...     upload_run(run.path, client=client)
    """

    def __init__(
        self, creds: Credentials | None = None, timeout: float = 60.0, http: Any = None, retry: Retry | None = None
    ) -> None:
        try:
            import httpx
        except ModuleNotFoundError:
            raise UploadError("uploading needs httpx: pip install 'ember[server]'") from None
        self.creds = creds or credentials()
        self.retry = retry or DEFAULT_RETRY
        self.until: float | None = None
        """A ``time.monotonic()`` after which no request is tried again (set by :class:`AutoUploader`)."""
        self._httpx = httpx
        self._timeout = timeout
        self._own = http is None  # its timeouts are ours to set per attempt (a TestClient warns when set)
        self._http = http if http is not None else httpx.Client(base_url=self.creds.host, timeout=timeout)
        self._headers = {"Authorization": f"Bearer {self.creds.api_key}"}

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request, tried until it succeeds, fails for good or reaches its deadline.

        Returns:
            The decoded JSON answer.

        Raises:
            ServerUnavailable: it still failed at the deadline (see the class).
            UploadError: the server refused it (its status and message), or the request cannot
                be sent at all (a malformed host).
        """
        httpx = self._httpx
        body = kwargs.get("content")
        start = body.tell() if body is not None and hasattr(body, "seek") else None
        began = time.monotonic()
        attempts = 0
        while True:
            attempts += 1
            deadline = (
                began + self.retry.deadline_s if self.until is None else min(began + self.retry.deadline_s, self.until)
            )
            if self._own:  # an attempt never runs far past the deadline
                kwargs["timeout"] = min(self._timeout, max(1.0, deadline - time.monotonic()))
            wait: float | None = None
            try:
                response = self._http.request(method, f"/api/v1{path}", headers=self._headers, **kwargs)
            except (httpx.NetworkError, httpx.TimeoutException, httpx.RemoteProtocolError) as e:
                reason = f"{type(e).__name__}: {e}"
            except httpx.HTTPError as e:
                raise UploadError(f"cannot reach the server {self.creds.host}: {e}") from None
            else:
                if not should_retry(response.status_code, response.headers):
                    break
                reason = f"{response.status_code} {_detail(response)}"
                wait = retry_after(response.headers)
            pause = max(self.retry.backoff(attempts - 1), min(wait or 0.0, self.retry.max_backoff_s))
            if time.monotonic() + pause >= deadline:
                elapsed = time.monotonic() - began
                raise ServerUnavailable(self.creds.host, f"{method} {path}", attempts, elapsed, reason)
            log.info("%s %s failed (%s): attempt %d in %.2f s", method, path, reason, attempts + 1, pause)
            time.sleep(pause)
            if body is not None and start is not None:
                body.seek(start)  # part of the body may have gone out before the connection dropped
        if response.status_code >= 400:
            raise UploadError(f"{method} {path} -> {response.status_code}: {_detail(response)}")
        return response.json()

    # The upload protocol (ember.track.receiver.Receiver) over /api/v1.

    def put_run(self, run_id: str, body: RunBody) -> Answer:
        """``PUT /runs/{id}``: create or update a run; its cursors."""
        return cast(Answer, self.call("PUT", f"/runs/{run_id}", json=body))

    def put_metrics(self, run_id: str, batch: MetricColumns) -> int:
        """``POST /runs/{id}/metrics``; the new cursor."""
        return int(self.call("POST", f"/runs/{run_id}/metrics", json=batch)["cursor"])

    def put_log(self, run_id: str, chunk: LogText) -> int:
        """``POST /runs/{id}/log``; the new cursor."""
        return int(self.call("POST", f"/runs/{run_id}/log", json=chunk)["cursor"])

    def put_lineage(self, kind: NodeKind, node_id: str, lines: LineageLines) -> int:
        """``POST /runs/{id}/lineage`` or ``/artifacts/{id}/lineage``; the new cursor."""
        return int(self.call("POST", f"/{kind}s/{node_id}/lineage", json=lines)["cursor"])

    def put_images(self, run_id: str, batch: ImageLines) -> int:
        """``POST /runs/{id}/images``; the new cursor."""
        return int(self.call("POST", f"/runs/{run_id}/images", json=batch)["cursor"])

    def missing_blobs(self, digests: list[str]) -> set[str]:
        """``POST /blobs/missing``: the digests to send."""
        return set(self.call("POST", "/blobs/missing", json={"sha256": digests})["missing"])

    def put_blob(self, sha256: str, file: IO[bytes]) -> None:
        """``PUT /blobs/{sha256}``: the file's bytes from its position, streamed (sent again whole on a retry)."""
        self.call("PUT", f"/blobs/{sha256}", content=file)

    def put_artifact(self, artifact_id: str, body: ArtifactBody) -> Answer:
        """``PUT /artifacts/{id}``: create or update an artifact."""
        return cast(Answer, self.call("PUT", f"/artifacts/{artifact_id}", json=body))


def _detail(response: Any) -> str:
    """The server's message in an error answer (its JSON ``detail``, else the start of the text)."""
    try:
        return str(response.json().get("detail", response.text))
    except (ValueError, AttributeError):
        return str(response.text[:500])


def refuse_links(folder: Path, what: str) -> None:
    """:class:`UploadError` naming the first symbolic link inside ``folder`` (at any depth).

    A run or artifact folder is uploaded as the regular files ember wrote there. A link
    (``stdout.log`` pointing at ``~/.ssh/id_rsa``, a ``files/`` folder pointing at ``/``) would
    send a file from elsewhere on this machine, so nothing is sent.
    """
    todo = [os.fspath(folder)]
    while todo:  # each folder's entries by name, then its subfolders; linked folders are listed, never entered
        try:
            with os.scandir(todo.pop()) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError:  # gone or unreadable, as os.walk skips it: reading its files says why
            continue
        for entry in entries:  # the kind comes with the listing (d_type): no stat per entry
            if entry.is_symlink():
                raise UploadError(
                    f"{entry.path} is a symbolic link: a {what} folder is uploaded only as the regular files "
                    "and folders in it (a link would send a file from elsewhere); replace the link by a copy"
                )
        todo += reversed([e.path for e in entries if e.is_dir(follow_symlinks=False)])


def _records(path: Path, offset: int, lines: list[bytes]) -> list[Any]:
    """The JSON values of non-blank lines (parsed as one array: several times faster than line by line)."""
    try:
        return list(json.loads(b"[" + b",".join(lines) + b"]"))
    except ValueError:
        for line in lines:
            try:
                json.loads(line)
            except ValueError as e:
                raise UploadError(
                    f"{path}: a line after byte {offset} is not JSON ({e}); the file is damaged"
                ) from None
        raise UploadError(f"{path}: the lines after byte {offset} are not one JSON value each") from None


def _send_metrics(receiver: RunReceiver, run_id: str, path: Path, cursor: int) -> int:
    """Send ``metrics/<type>.jsonl`` from ``cursor`` as column batches; return the new cursor.

    A batch holds at most :data:`BATCH_VALUES` cells (lines times metric names), the server's
    default limit per request.
    """
    while True:
        lines, end = lines_from(path, cursor, BATCH_LINES)
        if end == cursor:
            return cursor
        kept = [i for i, line in enumerate(lines) if line.strip()]
        records = _records(path, cursor, [lines[i] for i in kept])
        try:
            names = dict.fromkeys(name for r in records for name in r["metrics"])
            fit = max(1, BATCH_VALUES // max(1, len(names)))
            if len(records) > fit:  # cut after the fit-th non-blank line
                records = records[:fit]
                end = cursor + sum(len(line) + 1 for line in lines[: kept[fit - 1] + 1])
                names = dict.fromkeys(name for r in records for name in r["metrics"])
            body: MetricColumns = {
                "type": path.stem,
                "start": cursor,
                "end": end,
                "step": [r["step"] for r in records],
                "epoch": [r.get("epoch") for r in records],
                "time": [r["time"] for r in records],
                "metrics": {name: [r["metrics"].get(name) for r in records] for name in names},
            }
        except (KeyError, TypeError, AttributeError) as e:
            raise UploadError(
                f"{path}: a line after byte {cursor} is not a metric point ({type(e).__name__}: {e}); "
                "the file is damaged"
            ) from None
        cursor = receiver.put_metrics(run_id, body)


def _send_log(receiver: RunReceiver, run_id: str, path: Path, cursor: int) -> int:
    """Send ``stdout.log`` from ``cursor`` to its end; return the new cursor.

    Unlike the JSON Lines files, text without a final newline is sent too (a last ``print(...,
    end="")``, a progress bar): what is appended later continues from the cursor. Only the
    bytes of a character not yet completely written wait for the next upload.
    """
    while True:
        data = read_from(path, cursor, LOG_BATCH_BYTES)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        text = decoder.decode(data, final=False)
        end = cursor + len(data) - len(decoder.getstate()[0])
        if end == cursor:
            return cursor
        cursor = receiver.put_log(run_id, {"start": cursor, "end": end, "text": text})


def _placement(folder: str, make_folder: bool, conflict_strategy: str) -> Placement:
    if conflict_strategy not in CONFLICTS:
        raise UploadError(f"conflict_strategy {conflict_strategy!r}: use one of {', '.join(CONFLICTS)}")
    return {"folder": folder, "make_folder": make_folder, "conflict_strategy": conflict_strategy}  # type: ignore[typeddict-item]


def upload_run(
    path: str | os.PathLike[str],
    folder: str | None = None,
    make_folder: bool = False,
    conflict_strategy: str = "new",
    client: RunReceiver | None = None,
    artifacts: bool = True,
    points: bool = True,
) -> dict[str, Any]:
    """Upload (or continue uploading) one run folder and the artifacts it is linked to.

    Args:
        path: the run's folder in the local store.
        folder: the server folder; relative means under your home; default: the run's own.
        make_folder: create the folder (and parents) when missing.
        conflict_strategy: for a *different* run of the same name in that folder: ``new``
            (upload beside it), ``skip``, ``error`` or ``replace``. The same run (same id) is
            always continued in place.
        client: the receiver (:mod:`ember.track.receiver`): a :class:`Client`, default one from the
            stored credentials, or a server's own receiver in process; with ``artifacts``, one that
            receives artifacts too (a :class:`~ember.track.receiver.Receiver`).
        artifacts: also upload the artifacts found through the run's lineage.
        points: also send its files (metrics, lineage, output, images); False sends its
            ``run.json`` and platform only, and a later upload sends the files from the cursors
            (``ember ui`` lists every run first, then reads their points).

    Returns:
        ``{"id", "action", "folder", "cursors"}`` as the receiver reports after the upload.

    Raises:
        UploadError: the receiver refused a request (its reason), or a file of the run is
            damaged; what came before it is kept, and the next upload continues from there.
    """
    run_dir = Path(path)
    refuse_links(run_dir, "run")
    linked_artifacts = _linked_artifacts(run_dir) if artifacts else []
    for linked in linked_artifacts:  # checked before anything is sent
        refuse_links(linked, "artifact")
    meta = read_json(run_dir / "run.json")
    with _borrowed(client) as receiver, _keeping(f"the run {run_dir}", run_dir):
        platform = read_platform(run_dir) or {}
        place = _placement(folder or str(meta.get("folder", "default")), make_folder, conflict_strategy)
        body: RunBody = {**place, "run": meta, "platform": platform}
        rid = str(meta["id"])
        answer = receiver.put_run(rid, body)
        if answer["action"] == "skipped" or not points:
            return dict(answer)
        cursors: dict[str, int] = answer["cursors"]
        for file in sorted((run_dir / "metrics").glob("*.jsonl")):
            stream = f"metrics/{file.name}"
            cursors[stream] = _send_metrics(receiver, rid, file, cursors.get(stream, 0))
        for linked in linked_artifacts:
            upload_artifact(linked, body["folder"], make_folder, "new", _full(receiver))
        cursors["lineage.jsonl"] = _send_edges(receiver, "run", rid, run_dir, cursors.get("lineage.jsonl", 0))
        # The output and the images last: a server's limits on them (--max-log-mb, --max-run-images, the
        # quota) refuse them without holding back the rest.
        cursors["stdout.log"] = _send_log(receiver, rid, run_dir / "stdout.log", cursors.get("stdout.log", 0))
        if (run_dir / images.IMAGES_FILE).is_file():  # a server of an earlier ember has no /images route
            cursors[images.IMAGES_FILE] = images.send(
                receiver, rid, run_dir, cursors.get(images.IMAGES_FILE, 0), BATCH_LINES
            )
        answer["cursors"] = cursors
        return dict(answer)


def _full(receiver: RunReceiver) -> Receiver:
    """``receiver`` as one that takes artifacts too (:class:`UploadError` when it takes runs only)."""
    if not hasattr(receiver, "put_artifact"):
        raise UploadError(f"{type(receiver).__name__} receives runs only: upload with artifacts=False")
    return cast(Receiver, receiver)


def _linked_artifacts(run_dir: Path) -> list[Path]:
    """The folders of the local artifacts a run's lineage names (each once, in lineage order)."""
    found: dict[Path, None] = {}
    for edge in lineage.read_edges(run_dir):
        for end in (edge["source"], edge["target"]):
            linked = lineage.resolve_ref(end, run_dir.parent.parent)
            if end["kind"] == "artifact" and (linked / "artifact.json").is_file():
                found[linked] = None
    return list(found)


def _send_edges(receiver: RunReceiver, kind: NodeKind, node_id: str, folder: Path, cursor: int) -> int:
    """Send a node's ``lineage.jsonl`` from ``cursor`` in batches of complete lines; return the new cursor."""
    path = folder / lineage.LINEAGE_FILE
    while True:
        lines, end = lines_from(path, cursor, BATCH_LINES)
        if end == cursor:
            return cursor
        edges = _records(path, cursor, [line for line in lines if line.strip()])
        cursor = receiver.put_lineage(kind, node_id, {"start": cursor, "end": end, "edges": edges})


def _checked_file(art_dir: Path, rel: str) -> Path:
    """The stored copy of an artifact file, refusing links and anything outside ``files/``."""
    base = (art_dir / "files").resolve()
    file = art_dir / "files" / rel
    for part in [file, *file.parents]:
        if part == art_dir / "files":
            break
        if part.is_symlink():
            raise UploadError(f"{part} is a symbolic link; an artifact's stored copies must be regular files")
    if not file.is_file() or not file.resolve().is_relative_to(base):
        raise UploadError(f"{file}: not a regular file inside {base}; the artifact folder was changed by hand")
    return file


def upload_artifact(
    path: str | os.PathLike[str],
    folder: str = "default",
    make_folder: bool = False,
    conflict_strategy: str = "new",
    client: Receiver | None = None,
) -> dict[str, Any]:
    """Upload one artifact folder: the blobs the receiver lacks, then the metadata and lineage.

    Args: as for :func:`upload_run` (the artifact's folder instead of the run's).

    Returns:
        ``{"id", "action", "folder", "cursors"}``.
    """
    art_dir = Path(path)
    refuse_links(art_dir, "artifact")
    meta = read_json(art_dir / "artifact.json")
    with _borrowed(client) as receiver, _keeping(f"the artifact {art_dir}", art_dir):
        files = {f["path"]: _checked_file(art_dir, f["path"]) for f in meta.get("files", [])}
        digests = sorted({f["sha256"] for f in meta.get("files", [])})
        missing = receiver.missing_blobs(digests) if digests else set()
        for record in meta.get("files", []):
            if record["sha256"] in missing:
                with open(files[record["path"]], "rb", opener=no_follow) as f:
                    receiver.put_blob(record["sha256"], f)
                missing.discard(record["sha256"])
        keep = ("id", "name", "labels", "description", "created")
        artifact = {k: meta[k] for k in keep if k in meta}
        artifact["files"] = [{k: f[k] for k in ("path", "size", "sha256")} for f in meta.get("files", [])]
        artifact["references"] = [{"uri": r["uri"], "path": r["path"]} for r in meta.get("references", [])]
        body: ArtifactBody = {**_placement(folder, make_folder, conflict_strategy), "artifact": artifact}
        aid = str(meta["id"])
        answer = receiver.put_artifact(aid, body)
        if answer["action"] != "skipped":
            cursor = answer["cursors"].get("lineage.jsonl", 0)
            answer["cursors"]["lineage.jsonl"] = _send_edges(receiver, "artifact", aid, art_dir, cursor)
        return dict(answer)


def upload(
    path: str | os.PathLike[str],
    folder: str | None = None,
    make_folder: bool = False,
    conflict_strategy: str = "new",
) -> list[dict[str, Any]]:
    """Upload a run folder, an artifact folder, or every run and artifact of a store root.

    Example:
        >>> track.client.upload(".ember", folder="examples", make_folder=True)
    """
    root = Path(path)
    with Client() as client:
        if (root / "run.json").is_file():
            return [upload_run(root, folder, make_folder, conflict_strategy, client)]
        if (root / "artifact.json").is_file():
            return [
                upload_artifact(
                    root, folder or lineage.run_folder(root) or "default", make_folder, conflict_strategy, client
                )
            ]
        runs = sorted(p for p in (root / RUNS_DIR).glob("*") if (p / "run.json").is_file())
        arts = sorted(p for p in (root / ARTIFACTS_DIR).glob("*") if (p / "artifact.json").is_file())
        if not runs and not arts:
            raise UploadError(f"{root} holds no run.json, artifact.json, runs/ or artifacts/: nothing to upload")
        with _keeping(f"every run and artifact of {root}", root, replace=True):  # `ember upload ROOT` goes on
            done = [
                upload_artifact(a, folder or lineage.run_folder(a) or "default", make_folder, conflict_strategy, client)
                for a in arts
            ]
            return done + [upload_run(r, folder, make_folder, conflict_strategy, client, artifacts=False) for r in runs]


R = TypeVar("R", RunReceiver, Receiver)


@contextmanager
def _borrowed(client: R | None) -> Iterator[R | Client]:
    """``client``, or a new :class:`Client` closed when the block ends."""
    if client is not None:
        yield client
        return
    with Client() as own:
        yield own


@contextmanager
def _keeping(kept: str, path: Path, replace: bool = False) -> Iterator[None]:
    """Say in a :class:`ServerUnavailable` that the local store keeps ``kept`` (``ember upload PATH`` goes on).

    The innermost block's word stands unless ``replace`` (:meth:`ServerUnavailable.keep`).
    """
    try:
        yield
    except ServerUnavailable as e:
        e.keep(kept, path, replace)
        raise


class AutoUploader:
    """Streams a run to the server from a daemon thread while it trains.

    Every ``interval`` seconds it uploads what is new, through one persistent :class:`Client`
    (one connection pool for the run's life). A request that fails is retried as the client
    retries, for ``retry.deadline_s`` at most; a failure past that (server down, network) is
    logged once per distinct message and tried again at the next interval, so training is never
    blocked or failed, and the local copy stays complete. :meth:`close` makes a last attempt;
    it returns within about ``timeout`` seconds whatever the network does.
    """

    def __init__(
        self, run_path: Path, placement: dict[str, Any], interval: float = 2.0, retry: Retry | None = None
    ) -> None:
        self.run_path = run_path
        self.placement = placement
        self.interval = interval
        self.retry = retry or Retry(deadline_s=30.0)
        self.last_error: str | None = None
        self.synced = False
        self._client: Client | None = None
        self._until: float | None = None  # set by close: the last attempt's deadline
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="ember-auto-upload", daemon=True)
        self._thread.start()

    def _connection(self) -> Client:
        """The uploader's one client, made on first use (the credentials may come later)."""
        with self._lock:
            if self._client is None:
                self._client = Client(timeout=30.0, retry=self.retry)
                self._client.until = self._until
            return self._client

    def _attempt(self) -> bool:
        try:
            upload_run(self.run_path, client=self._connection(), **self.placement)
        except (TrackingError, OSError) as e:  # UploadError is a TrackingError
            if str(e) != self.last_error:
                log.warning("auto-upload of %s failed (will retry; the local copy is complete): %s", self.run_path, e)
            self.last_error = str(e)
            return False
        self.last_error = None
        return True

    def _loop(self) -> None:
        while not self._stop:
            self._wake.wait(self.interval)
            self._wake.clear()
            if not self._stop:
                self._attempt()

    def close(self, timeout: float = 30.0) -> bool:
        """Stop the thread and upload what remains; return whether the server has it all."""
        with self._lock:
            self._until = time.monotonic() + timeout
            if self._client is not None:
                self._client.until = self._until  # a retry in flight in the thread gives up by then too
        self._stop = True
        self._wake.set()
        self._thread.join(max(0.0, self._until - time.monotonic()))
        self.synced = self._attempt()
        with self._lock:
            if self._client is not None:
                self._client.close()
        return self.synced
