"""Runs: create or update one from its run.json, place a new node in its folder, read one back,
edit its name, labels and description, move it to the trash and back, delete.

The service behind the upload protocol's runs (:class:`ember.server.services.upload.Uploads`,
which ``/api/v1/runs`` and ``ember ui`` call, and its batched :class:`~ember.server.services.upload.NewRuns`):
plain functions over a session that raise :mod:`ember.server.storage.domain_errors`. Every change
checks the caller's level as the route always did: edit on an existing run, edit on the folder
a new one goes into, edit on each node a ``replace`` removes.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ember.server.services import codec, edges, ingest, naming, series
from ember.server.services.lookup import claim_id, get_run
from ember.server.services.perms import Level, check_owned, drop_shares, ensure_folder, level, require, shares_of
from ember.server.storage.domain_errors import Conflict, Invalid, NotFound, TooLarge
from ember.server.storage.models import Artifact, ArtifactFile, Folder, Run, User, aware, now
from ember.server.storage.schemas import Placement, RunEdit, RunIn

STATUSES = ("Running", "Complete", "Failed", "Interrupted", "Preempted")
MAX_META_BYTES = 1 << 20
"""The largest run.json, and the largest platform.json, a run may have (their JSON, in bytes): each
page of the run and every listing holding it reads them whole."""
SKIPPED = "ember_ui_skipped"
"""The key of ``Run.meta`` listing the metrics lines ``ember ui``'s index skipped (the run page lists
them): ``["metrics/train.jsonl: ..."]``."""
TRASH_DAYS = 7
"""How long a run stays in the trash before the server purges it (its hourly collection)."""
PURGE_AFTER = timedelta(days=TRASH_DAYS)
EDITABLE = ("name", "labels", "description")
"""The fields of a run a user edits on the server; once edited there, an upload leaves them alone."""
MAX_LABELS = 1000
MAX_LABEL_CHARS = 100
MAX_DESCRIPTION_CHARS = 100_000


def checked_meta(body: RunIn, run_id: str) -> dict[str, Any]:
    """run.json and platform.json of a ``PUT /runs/{id}``, checked (422 naming what is wrong, 413 for one
    over :data:`MAX_META_BYTES`)."""
    codec.check(body.run, "run")
    codec.check(body.platform, "platform")
    for name, value in (("run.json", body.run), ("platform.json", body.platform)):
        size = len(codec.encode(value))
        if size > MAX_META_BYTES:
            raise TooLarge(
                f"{name} of run {run_id} is {size} bytes as JSON, over the {MAX_META_BYTES} a run's may hold: "
                "keep large configurations and notes in an artifact"
            )
    meta = body.run
    if meta.get("id") != run_id:
        raise Invalid(f"run.id {meta.get('id')!r} differs from the id in the URL {run_id!r}")
    naming.display_name(meta.get("name"), "run.name")  # type: ignore[arg-type]
    if meta.get("status") not in STATUSES:
        raise Invalid(f"run.status {meta.get('status')!r} is not one of {', '.join(STATUSES)}")
    for key, kind in (("labels", list), ("hparams", dict), ("description", str)):
        if not isinstance(meta.get(key, kind()), kind):
            raise Invalid(f"run.{key} must be a {kind.__name__}, got {type(meta.get(key)).__name__}")
    for key in ("start_time", "end_time"):
        if meta.get(key) is not None and not (isinstance(meta[key], str) and len(meta[key]) <= 40):
            raise Invalid(f"run.{key} must be an ISO 8601 time or null")
    return meta


def meta_columns(meta: dict[str, Any], platform: dict[str, Any], edited: Any = ()) -> dict[str, Any]:
    """A run's columns from its checked run.json (and platform.json, when sent); the fields in ``edited``
    (changed on the server: the server's value wins over run.json) are left out."""
    columns: dict[str, Any] = {
        "name": meta["name"],
        "status": meta["status"],
        "start_time": meta.get("start_time"),
        "end_time": meta.get("end_time"),
        "labels": [str(x) for x in meta.get("labels", [])],
        "description": meta.get("description", ""),
        "hparams": meta.get("hparams", {}),
        "meta": meta,
        "uploaded": now(),
    }
    if platform:
        columns["platform"] = platform
    for name in set(edited or ()) & set(EDITABLE):
        del columns[name]
    return columns


def apply_meta(run: Run, meta: dict[str, Any], platform: dict[str, Any]) -> None:
    """Set a run's columns from its checked run.json (and platform.json, when sent): :func:`meta_columns`."""
    for name, value in meta_columns(meta, platform, run.edited).items():
        setattr(run, name, value)


def place(
    session: Session, user: User, body: Placement, model: type[Any], name: str, what: str, max_folders: int | None
) -> tuple[Folder, str, set[str]]:
    """The folder for a new node, what the conflict strategy says to do (create or skip), and
    the blob digests of artifacts it replaced (to collect once they are no longer listed);
    ``max_folders``: the owner's limit on folders, for those made here."""
    folder = ensure_folder(session, user, body.folder, body.make_folder, max_folders=max_folders)
    same = session.scalars(select(model).where(model.folder_id == folder.id, model.name == name)).all()
    if not same or body.conflict_strategy == "new":
        return folder, "created", set()
    if body.conflict_strategy == "skip":
        return folder, "skipped", set()
    if body.conflict_strategy == "error":
        raise Conflict(f"folder {folder.path!r} already holds a {what} named {name!r}; pass another conflict_strategy")
    freed: set[str] = set()
    for old in same:  # replace
        require(level(session, user, old, folder), Level.EDIT, f"{what} {old.id}")
        if isinstance(old, Artifact):
            freed |= set(session.scalars(select(ArtifactFile.sha256).where(ArtifactFile.artifact_pk == old.pk)))
        ingest.drop_cursors(session, what, old.id)
        drop_shares(session, what, old.pk)
        session.delete(old)
    session.flush()
    return folder, "created", freed


def put_run(
    session: Session, user: User, run_id: str, body: RunIn, *, max_runs: int | None, max_folders: int | None
) -> dict[str, Any]:
    """Create or update a run (by id: the same run is updated in place); ``cursors`` says what the server has.

    A new run is refused (413, nothing made) when it would take its tree's owner past ``max_runs``
    runs, or the folders it makes past ``max_folders`` (None: no limit).
    """
    meta = checked_meta(body, naming.node_id(run_id, "run id"))
    run = session.scalar(select(Run).where(Run.id == run_id))
    if run is not None:  # one in the trash too: it keeps receiving, and stays there until restored
        require(level(session, user, run), Level.EDIT, f"run {run_id}")
        apply_meta(run, meta, body.platform)
        action = "updated"
    else:
        claim_id(session, "run", run_id)
        folder, action, _ = place(session, user, body, Run, meta["name"], "run", max_folders)
        if action == "skipped":
            return {"id": run_id, "action": action, "folder": folder.path, "cursors": {}}
        check_owned(session, Run, folder.owner_id, 1, max_runs)
        run = Run(id=run_id, folder_id=folder.id, owner_id=folder.owner_id, platform={})
        apply_meta(run, meta, body.platform)
        session.add(run)
        session.flush()
    folder_path = session.scalar(select(Folder.path).where(Folder.id == run.folder_id))
    return {"id": run_id, "action": action, "folder": folder_path, "cursors": ingest.cursors(session, "run", run_id)}


def run_view(session: Session, user: User, run: Run, depth: int | None = 1) -> dict[str, Any]:
    """A run the caller may view: metadata, hparams, platform, metric summary, lineage (as they may see it).

    ``lineage`` holds the edges, ``depth`` levels upstream and downstream (``None``: all), whose other
    end the caller may view; ``lineage_hidden`` counts the others
    (:func:`ember.server.services.edges.edges_of`), ``lineage_more`` the visible ones left out at the
    walk's caps, ``lineage_levels`` each node's level (see :func:`lineage_fields`).
    """
    lineage = edges.edges_of(session, "run", run.id, run.name, user, depth)
    return {
        "id": run.id,
        "name": run.name,
        "folder": session.scalar(select(Folder.path).where(Folder.id == run.folder_id)),
        "owner": session.scalar(select(User.name).where(User.id == run.owner_id)),
        "status": run.status,
        "start_time": run.start_time,
        "end_time": run.end_time,
        "labels": run.labels,
        "description": run.description,
        "edited": list(run.edited or ()),
        "hparams": run.hparams,
        "platform": run.platform,
        "meta": run.meta,
        "metrics": series.metric_counts(session, run.pk),
        **edges.lineage_fields(lineage),
        "cursors": ingest.cursors(session, "run", run.id),
        "shares": shares_of(session, "run", run.pk),
    }


def edit_run(session: Session, user: User, run_id: str, body: RunEdit) -> dict[str, Any]:
    """Change a run's name, labels or description (the fields given); needs edit on the run.

    Each field changed is remembered in ``run.edited``: a later upload of the run's ``run.json``
    leaves it alone (the server's edit wins), the other fields follow the upload as before.

    Raises:
        Invalid: 422 for an empty or over-long name, a label over 100 characters or with a
            comma, more than 1,000 labels, a description over 100,000 characters.

    Example:
        >>> edit_run(session, alice, run_id, RunEdit(name="baseline", labels=["keep"]))
    """
    run = get_run(session, user, run_id, Level.EDIT)
    changed: list[str] = []
    if body.name is not None:
        run.name = naming.display_name(body.name.strip(), "name")
        changed.append("name")
    if body.labels is not None:
        run.labels = checked_labels(body.labels)
        changed.append("labels")
    if body.description is not None:
        if len(body.description) > MAX_DESCRIPTION_CHARS:
            raise Invalid.field("description", f"is {len(body.description)} characters, over {MAX_DESCRIPTION_CHARS}")
        run.description = body.description
        changed.append("description")
    codec.check({"name": run.name, "labels": run.labels, "description": run.description}, "run")
    run.edited = sorted(set(run.edited or ()) | set(changed))
    return {"id": run.id, "name": run.name, "labels": run.labels, "description": run.description, "edited": run.edited}


def checked_labels(labels: list[str]) -> list[str]:
    """Labels as a run keeps them: stripped, empty ones dropped, each once in the order given (422 past the limits)."""
    out: list[str] = []
    for label in (str(x).strip() for x in labels):
        if len(label) > MAX_LABEL_CHARS or "," in label:
            raise Invalid.field(
                "labels", f"{label[:40]!r}: a label holds at most {MAX_LABEL_CHARS} characters, no comma"
            )
        if label and label not in out:
            out.append(label)
    if len(out) > MAX_LABELS:
        raise Invalid.field("labels", f"{len(out)} labels, over the {MAX_LABELS} a run may hold")
    return out


def trash_run(session: Session, user: User, run_id: str) -> dict[str, Any]:
    """Move a run the caller may edit to the trash: hidden from every page, listing and search,
    restorable with :func:`restore_run`, purged after :data:`TRASH_DAYS` days (or by
    :func:`delete_run`). Its points, files and grants are kept until then."""
    run = get_run(session, user, run_id, Level.EDIT)
    run.deleted = now()
    return _trashed(run)


def restore_run(session: Session, user: User, run_id: str) -> dict[str, Any]:
    """Take a run out of the trash (edit on it needed; 404 for one not in the trash)."""
    run = get_run(session, user, run_id, Level.EDIT, trashed=True)
    if run.deleted is None:
        raise NotFound(f"run {run_id} is not in the trash")
    run.deleted = None
    return {"id": run.id, "restored": True}


def _trashed(run: Run) -> dict[str, Any]:
    assert run.deleted is not None
    when = aware(run.deleted)
    return {
        "id": run.id,
        "name": run.name,
        "trashed": when.isoformat(),
        "purge_after": (when + PURGE_AFTER).isoformat(),
    }


def trash_of(session: Session, user: User) -> list[dict[str, Any]]:
    """The runs in the trash the caller may edit (restore or purge), newest deletion first."""
    rows = session.scalars(select(Run).where(Run.deleted.is_not(None)).order_by(Run.deleted.desc(), Run.pk))
    out = []
    for run in rows:
        if level(session, user, run) >= Level.EDIT:
            folder = session.scalar(select(Folder.path).where(Folder.id == run.folder_id))
            out.append({**_trashed(run), "folder": folder})
    return out


def purge_expired(session: Session) -> int:
    """Delete the runs whose time in the trash is over (:data:`TRASH_DAYS`); return how many."""
    expired = list(session.scalars(select(Run).where(Run.deleted.is_not(None), Run.deleted < now() - PURGE_AFTER)))
    for run in expired:
        _purge(session, run)
    return len(expired)


def delete_run(session: Session, user: User, run_id: str) -> dict[str, Any]:
    """Delete a run the caller may edit (in the trash or not) at once, with its points, cursors and grants."""
    run = get_run(session, user, run_id, Level.EDIT, trashed=True)
    _purge(session, run)
    return {"id": run_id, "deleted": True}


def _purge(session: Session, run: Run) -> None:
    ingest.drop_cursors(session, "run", run.id)
    drop_shares(session, "run", run.pk)
    session.delete(run)
