"""``ember ui``'s index: the console's database kept in step with a local store, in the background.

Pages never wait for the store: they read the database as it is, so a page costs the same
whatever the store's size. One thread (:class:`StoreIndex`) brings the database up to date:

- **At start** the run folders are listed (names only) and their metadata indexed newest first
  (by the time in a folder's name), a batch per transaction: the first page answers at once,
  shows the newest runs within a second, and says how far indexing has got until it is done.
  New runs' ``run.json`` and platform are read as the upload sends them, to the batched receiver
  that writes them together (:class:`ember.server.services.upload.NewRuns`), so every run is
  listed and counted before any run's points are read: a run of a million points no longer
  holds back the others. Then each listed run's files (metrics, lineage, output, images) are
  sent from its cursors, newest run first, to the receiver in process; a restart with
  ``--data`` sends only what follows the stored cursors.
- **Then, every second,** what may have changed, at a cost that does not grow with the store
  (:mod:`ember.server.local.scan`): a folder is read again only when its files changed, and
  then only what follows the stored cursors is sent, request by request, to the server's own
  receiver in process (:class:`ember.server.services.upload.Uploads`).

Artifacts go through the upload protocol over HTTP to this same server, which streams their
files into its blob store. A run folder ember could not have written
(:func:`ember.track.store.run_info`), or whose files the server refuses, is listed with the
status ``Damaged`` and the reason; the others are listed as usual.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from ember.errors import TrackingError
from ember.server.console import Progress
from ember.server.local import manifest, salvage
from ember.server.local.damaged import damaged_id, forget_artifact, forget_run, mark_damaged
from ember.server.local.scan import HOT_S, Entry, Folders, signature
from ember.server.services.upload import NewRuns, Recorded, Uploads
from ember.server.storage.models import Run, User
from ember.track import lineage
from ember.track.client import Client, Credentials, UploadError, upload_artifact, upload_run
from ember.track.layout import ARTIFACTS_DIR, RUNS_DIR
from ember.track.store import DAMAGED, STALE_AFTER_S, run_info

if TYPE_CHECKING:
    from fastapi import FastAPI
    from sqlalchemy.orm import Session

log = logging.getLogger("ember.server")
INTERVAL_S = 1.0
"""Seconds between passes once the store is indexed."""
BATCH_S = 0.25
"""Indexing work per transaction: pages see the progress after each."""
PASS_S = 1.0
BIG_BYTES = 8 << 20
"""A run whose metrics files hold more bytes (about 100,000 points) has its points read after the others'."""
"""Indexing work per pass on a cold start, before the live runs are checked again."""
_ID = re.compile(r"^[0-9a-f]{32}$")


@dataclass(frozen=True)
class _Outcome:
    """What indexing one run folder gave, remembered once its transaction is committed."""

    name: str
    signature: tuple[Any, ...] | None
    node_id: str | None
    error: str | None
    live: bool
    first: bool
    listed_only: bool = False  # its metadata is written, its files are still to read
    kept: bool = False  # unchanged since the manifest's row (a restart): nothing was read


@dataclass(frozen=True)
class _Found:
    """A run folder as :meth:`StoreIndex._check` found it, before it is written."""

    name: str
    entry: Entry
    signature: tuple[Any, ...] | None
    meta: dict[str, Any]
    node: str
    reason: str | None
    running: bool


class StoreIndex:
    """Keeps ``ember ui``'s database in step with a local store (see the module).

    Args:
        app: the server app whose database is filled.
        store: the store root (holding ``runs/`` and ``artifacts/``).
        user: the user the runs are filed under (``/<user>/<run's folder>``).
        credentials: this same server's address and the user's key: artifacts are uploaded with them.
        http: the HTTP client to send them with (a test's ``TestClient``; default: a new one per pass)
        interval: seconds between passes once everything is indexed.

    Example:
        >>> index = StoreIndex(app, Path(".ember"), "local", Credentials("http://127.0.0.1:8766", key))
        >>> index.start()          # or index.step() for one pass
    """

    def __init__(
        self,
        app: FastAPI,
        store: Path,
        user: str,
        credentials: Credentials,
        http: Any = None,
        interval: float = INTERVAL_S,
    ) -> None:
        self.app, self.store, self.user, self.interval = app, store, user, interval
        self.credentials, self.http = credentials, http
        self._runs = Folders(store, RUNS_DIR, "run.json")
        self._artifacts = Folders(store, ARTIFACTS_DIR, "artifact.json")
        self._ids: dict[str, str] = {}  # run id -> the folder indexed under it
        self._damaged: set[str] = set()
        self._artifact_errors: dict[str, str] = {}
        self._failure: str | None = None
        self._pruned = False
        self._reading: list[str] = []  # the runs whose points are being read now
        self._kept: dict[str, manifest.Kept] | None = None  # the manifest's rows, until each folder is seen
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Index in a daemon thread until :meth:`stop`."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="ember-ui-index", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread after its current pass."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def progress(self) -> Progress:
        """How far indexing has got (cheap: counters, whatever the store's size)."""
        errors = tuple(f"{name}: {why}" for name, why in list(self._artifact_errors.items())[:20])
        runs = self._runs
        return Progress(
            len(runs.entries),
            runs.indexed,
            len(self._damaged),
            errors,
            self._failure,
            len(runs.points) + len(runs.big) + len(self._reading),
        )

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self.step()
                self._failure = None
            except Exception as e:  # logged, shown on the pages and tried again: the console must keep serving
                log.exception("ember ui: indexing %s failed", self.store)
                self._failure = f"{type(e).__name__}: {e}"
                busy = False
            if not busy:
                self._stop.wait(self.interval)

    def step(self) -> bool:
        """One pass (see the module); True when folders are still waiting to be indexed or read."""
        with self._lock:
            if self._kept is None:
                self._kept = self._load_manifest()
            now = time.monotonic()
            deadline = now + PASS_S
            gone = self._runs.discover()
            self._damaged = {n for n in self._damaged if n in self._runs.entries}
            self._write_runs(self._runs.changed(now), gone, deadline)
            if not self._pruned and not self._runs.pending:
                self._prune()
            if not self._runs.pending:
                self._read_points(deadline)
            gone = self._artifacts.discover()
            self._write_artifacts(self._artifacts.changed(now), gone, deadline)
            return bool(self._runs.pending or self._runs.points or self._runs.big or self._artifacts.pending)

    def _write_runs(self, changed: list[str], gone: list[Entry], deadline: float) -> None:
        """Index the changed runs, drop the gone ones, then index pending ones until ``deadline``.

        One transaction per :data:`BATCH_S` of work; what is remembered of each folder changes
        only once its transaction is committed (a failed one leaves its folders to index again).
        """
        kind = self._runs
        todo = [*changed]
        first = True  # a pass indexes at least one pending run, whatever its deadline
        while gone or todo or (kind.pending and (first or time.monotonic() < deadline)):
            first = False
            taken: list[str] = []
            outcomes: list[_Outcome] = []
            try:
                with self.app.state.sessions() as session, session.begin():
                    user = session.scalar(select(User).where(User.name == self.user))
                    assert user is not None, f"ember ui's user {self.user!r} is missing from its database"
                    uploads = self._uploads(session, user)
                    for entry in gone:
                        if entry.node_id is not None and self._ids.get(entry.node_id) == entry.path.name:
                            forget_run(uploads, entry.node_id)
                    manifest.forget(session, [entry.path.name for entry in gone])
                    ends = time.monotonic() + BATCH_S
                    claimed: dict[str, str] = {}
                    while todo and time.monotonic() < ends:  # changed runs: request by request
                        outcomes.append(self._update(session, user, uploads, self._check(todo.pop(), claimed)))
                    fresh = []
                    new = NewRuns()
                    # New runs: read, then written together; at least one per transaction.
                    while kind.pending and (not taken or time.monotonic() < min(ends, deadline)):
                        taken.append(kind.pending.pop())
                        unchanged = self._unchanged(taken[-1], claimed)
                        if unchanged is not None:
                            outcomes.append(unchanged)
                        else:
                            fresh.append(self._read(self._check(taken[-1], claimed), new))
                    outcomes += self._write_new(session, user, uploads, new, fresh)
                    self._save_manifest(session, outcomes)
            except BaseException:
                kind.pending.extend(reversed(taken))
                raise
            for entry in gone:
                if entry.node_id is not None and self._ids.get(entry.node_id) == entry.path.name:
                    del self._ids[entry.node_id]
            gone = []
            for outcome in outcomes:
                self._remember(outcome)

    def _read_points(self, deadline: float) -> None:
        """Send the files of listed runs (newest first) from their cursors until ``deadline``, at least one.

        One transaction per :data:`BATCH_S` of work, as :meth:`_write_runs`. Runs of more than
        :data:`BIG_BYTES` of metrics come after the others: a run of a million points takes its
        own time, but every run is listed and counted by then, and the small runs' charts drawn.
        """
        kind = self._runs
        first = True
        while (kind.points or kind.big) and (first or time.monotonic() < deadline):
            queue = kind.points or kind.big
            first = False
            taken: list[str] = []
            outcomes: list[_Outcome] = []
            self._reading = taken
            try:
                with self.app.state.sessions() as session, session.begin():
                    user = session.scalar(select(User).where(User.name == self.user))
                    assert user is not None, f"ember ui's user {self.user!r} is missing from its database"
                    uploads = self._uploads(session, user)
                    ends = time.monotonic() + BATCH_S
                    claimed: dict[str, str] = {}
                    while queue and (not taken or time.monotonic() < min(ends, deadline)):
                        taken.append(queue.pop(0))
                        outcomes.append(self._update(session, user, uploads, self._check(taken[-1], claimed)))
                    self._save_manifest(session, outcomes)
            except BaseException:
                queue[:0] = taken
                raise
            finally:
                self._reading = []
            for outcome in outcomes:
                self._remember(outcome)

    def _prune(self) -> None:
        """Once every folder is indexed: drop the runs a kept database (``--data``) holds of folders gone since."""
        with self.app.state.sessions() as session, session.begin():
            user = session.scalar(select(User).where(User.name == self.user))
            assert user is not None, f"ember ui's user {self.user!r} is missing from its database"
            uploads = self._uploads(session, user)
            for run_id in list(session.scalars(select(Run.id).where(Run.owner_id == user.id))):
                if run_id not in self._ids:
                    forget_run(uploads, run_id)
            manifest.forget(session, [name for name in manifest.names(session) if name not in self._runs.entries])
        self._pruned = True
        self._kept = {}

    def _load_manifest(self) -> dict[str, manifest.Kept]:
        """The manifest's rows (:mod:`ember.server.local.manifest`) whose runs the database still holds."""
        with self.app.state.sessions() as session, session.begin():
            kept = manifest.load(session)
            user = session.scalar(select(User).where(User.name == self.user))
            held = set(session.scalars(select(Run.id).where(Run.owner_id == user.id))) if user is not None else set()
        return {name: k for name, k in kept.items() if k.node_id in held}

    def _unchanged(self, name: str, claimed: dict[str, str]) -> _Outcome | None:
        """A folder listed as its manifest row says, when nothing in it changed since (see the manifest); else None."""
        kept = (self._kept or {}).pop(name, None)
        if kept is None or kept.live:  # a live run's status moves with time: read again
            return None
        holder = claimed.get(kept.node_id) or self._ids.get(kept.node_id)
        if holder not in (None, name):
            return None
        entry = self._runs.entries[name]
        sig = signature(entry.path)
        if sig is None or manifest.digest(sig) != kept.signature:
            return None
        claimed[kept.node_id] = name
        return _Outcome(name, sig, kept.node_id, kept.error, False, True, kept=True)

    def _save_manifest(self, session: Session, outcomes: list[_Outcome]) -> None:
        """Rows for the folders indexed whole in this transaction (see the manifest)."""
        rows = {
            o.name: manifest.Kept(manifest.digest(o.signature), o.node_id, o.error, o.live)
            for o in outcomes
            if o.signature is not None and o.node_id is not None and not (o.listed_only or o.kept)
        }
        manifest.save(session, rows)

    def _uploads(self, session: Session, user: User) -> Uploads:
        """The server's receiver in process, on the pass's transaction: the user's own store, unbounded."""
        return Uploads(session, user, self.app.state.settings, self.app.state.blobs, in_process=True, own_store=True)

    def _check(self, name: str, claimed: dict[str, str]) -> _Found:
        """A run folder's signature (taken before reading it: a change while reading shows next pass), its
        run.json, and why it is damaged (or holds the id of another folder), if it is."""
        entry = self._runs.entries[name]
        sig = signature(entry.path)
        info = run_info(entry.path)
        run_id = info.meta.get("id")
        run_id = run_id if isinstance(run_id, str) and _ID.fullmatch(run_id) else None
        holder = (claimed.get(run_id) or self._ids.get(run_id)) if run_id else None
        if holder is not None and (holder == name or holder not in self._runs.entries):
            holder = None
        reason = info.error
        if reason is None and holder is not None:
            reason = f"its id {run_id} is the id of the run folder {holder} too (a copy?); that one is listed under it"
        if run_id is not None and holder is None:
            node = run_id
        elif run_id is None and entry.node_id is not None and self._ids.get(entry.node_id) == name:
            node = entry.node_id  # run.json no longer says: the row indexed before is marked, its data kept
        else:
            node = damaged_id(name)
        claimed[node] = name
        return _Found(name, entry, sig, info.meta, node, reason, info.status == "Running")

    def _update(self, session: Session, user: User, uploads: Uploads, found: _Found, points: bool = True) -> _Outcome:
        """Bring a run the database may hold up to date, request by request (each a savepoint).

        ``points=False``: its ``run.json`` only (a cold start lists every run first); the outcome
        queues its files for :meth:`_read_points`.
        """
        reason = found.reason
        if reason is None and found.signature is not None:
            if found.entry.error is not None and self._ids.get(found.node) == found.name:
                forget_run(uploads, found.node)  # mended: read again whole, into the folder its run.json names
            try:
                salvage.upload(found.entry.path, found.node, uploads, points)
            except TrackingError as e:  # UploadError too: the server's code refused part of it
                reason = str(e)
            except Exception as e:  # a bug must cost this run only: it is listed with the error
                log.exception("ember ui: indexing %s failed", found.entry.path)
                reason = f"ember ui could not index it ({type(e).__name__}: {e})"
        return self._settle(session, user, uploads, found, reason, listed_only=not points)

    def _read(self, found: _Found, new: NewRuns) -> tuple[_Found, Recorded]:
        """Read a new run's metadata as the upload sends it, to the batched receiver (nothing is written yet)."""
        recorded = new.open(found.name)
        if found.reason is None and found.signature is not None:
            try:
                upload_run(found.entry.path, None, True, "new", new, artifacts=False, points=False)
            except TrackingError as e:  # a damaged line, a body the server would refuse
                recorded.error = str(e)
            except Exception as e:  # a bug must cost this run only: it is listed with the error
                log.exception("ember ui: reading %s failed", found.entry.path)
                recorded.error = f"ember ui could not read it ({type(e).__name__}: {e})"
        return found, recorded

    def _write_new(
        self, session: Session, user: User, uploads: Uploads, new: NewRuns, fresh: list[tuple[_Found, Recorded]]
    ) -> list[_Outcome]:
        """Write runs read by :meth:`_read`: those new to the database together (:meth:`NewRuns.write`).

        Each is listed only: its files follow in :meth:`_read_points`.
        """
        if not fresh:
            return []
        ids = [found.node for found, _ in fresh]
        held = set(session.scalars(select(Run.id).where(Run.id.in_(ids))))
        # A run whose reading stopped (a damaged line) goes request by request: salvage.upload skips the line.
        held |= {found.node for found, rec in fresh if rec.run is not None and rec.error is not None}
        together = [
            rec for found, rec in fresh if found.reason is None and rec.run is not None and found.node not in held
        ]
        try:
            with session.begin_nested():
                written = new.write(session, user, self.app.state.settings, together)
        except Exception:  # a bug in the batch path must not stop indexing: these runs go request by request
            log.exception("ember ui: writing %d runs together failed; writing them one by one", len(together))
            written, held = {}, held | {rec.run_id for rec in together}
        outcomes = []
        for found, rec in fresh:
            if found.reason is None and found.node in held:
                outcomes.append(self._update(session, user, uploads, found, points=False))
                continue
            reason = found.reason or (written.get(found.name) if rec.run is not None else rec.error)
            outcomes.append(self._settle(session, user, uploads, found, reason, listed_only=True))
        return outcomes

    def _settle(
        self,
        session: Session,
        user: User,
        uploads: Uploads,
        found: _Found,
        reason: str | None,
        listed_only: bool = False,
    ) -> _Outcome:
        """List a run ``Damaged`` when it is; drop the row of an id it no longer has; what to remember of it.

        ``listed_only``: only its metadata was written; unless it is Damaged its files are read next.
        """
        entry = found.entry
        if found.signature is None:  # gone: the next listing drops it
            return _Outcome(found.name, None, entry.node_id, entry.error, False, False)
        if reason is not None:
            reason = reason.replace(f"{self.store}{os.sep}", "")  # paths inside the store, from its root
            with session.begin_nested():
                mark_damaged(session, user, found.node, found.name, found.meta, reason)
        if entry.node_id not in (None, found.node) and self._ids.get(entry.node_id or "") == found.name:
            forget_run(uploads, entry.node_id or "")
        live = reason is None and found.running
        first = entry.signature is None
        return _Outcome(found.name, found.signature, found.node, reason, live, first, listed_only and reason is None)

    def _remember(self, outcome: _Outcome) -> None:
        """What was committed of one run folder."""
        kind, name = self._runs, outcome.name
        entry = kind.entries.get(name)
        if entry is None or outcome.signature is None:
            return
        if entry.error != outcome.error and outcome.error is not None:
            log.warning("ember ui: %s is listed as Damaged: %s", entry.path, outcome.error)
        if entry.node_id not in (None, outcome.node_id) and self._ids.get(entry.node_id or "") == name:
            del self._ids[entry.node_id or ""]
        kind.indexed += not entry.listed
        entry.listed, entry.node_id, entry.error = True, outcome.node_id, outcome.error
        if outcome.node_id is not None:
            self._ids[outcome.node_id] = name
        if outcome.error is None:
            self._damaged.discard(name)
        else:
            self._damaged.add(name)
        if outcome.listed_only:  # its files next, in the order listed (newest first), the big ones last
            sizes = (f[2] for f in (outcome.signature or ())[1:] if str(f[0]).startswith("metrics/"))
            (kind.big if sum(sizes) > BIG_BYTES else kind.points).append(name)
            return
        entry.signature = outcome.signature
        if outcome.live or not outcome.first:  # a live run, or one that changed: watched closely for a while
            kind.watch(name, STALE_AFTER_S if outcome.live else HOT_S)

    def _write_artifacts(self, changed: list[str], gone: list[Entry], deadline: float) -> None:
        """Upload the changed and pending artifacts over HTTP, delete the gone ones (once the server answers)."""
        kind = self._artifacts
        for entry in gone:
            self._artifact_errors.pop(entry.path.name, None)
        if not (changed or gone or kind.pending):
            return
        client = Client(self.credentials, timeout=120.0, http=self.http)
        try:
            self._upload_artifacts(client, changed, gone, deadline)
        finally:
            if self.http is None:  # a client given by the caller stays open
                client.close()

    def _upload_artifacts(self, client: Client, changed: list[str], gone: list[Entry], deadline: float) -> None:
        kind = self._artifacts
        try:
            client.call("GET", "/me")
        except UploadError:
            return  # the server is not listening yet: next pass
        for entry in gone:
            if entry.node_id is not None:
                forget_artifact(client, entry.node_id)
        todo = [*changed]
        while todo or (kind.pending and time.monotonic() < deadline):
            name = todo.pop() if todo else kind.pending.pop()
            entry = kind.entries[name]
            first = entry.signature is None
            kind.indexed += first
            entry.signature, entry.listed = signature(entry.path), True
            try:
                home = lineage.run_folder(entry.path) or "default"  # beside the run it came from
                entry.node_id = str(upload_artifact(entry.path, home, True, "new", client)["id"])
                entry.error = None
                self._artifact_errors.pop(name, None)
            except TrackingError as e:
                if entry.error != str(e):
                    log.warning("ember ui: could not load %s: %s", entry.path, e)
                entry.error = self._artifact_errors[name] = str(e)
            if not first:
                kind.watch(name, HOT_S)


__all__ = ["DAMAGED", "Progress", "StoreIndex", "signature"]
