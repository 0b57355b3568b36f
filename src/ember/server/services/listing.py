"""Queries behind the runs table: visible runs, filters, sorting, last and best metrics.

Shared by the REST API (``GET /api/v1/runs``) and the console. Every
listing starts from :func:`visible_runs`, the one place that decides which runs a user may see,
so a filter or a sort can never reach a run the caller has no view right on.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, false, func, or_, select
from sqlalchemy.orm import Session

from ember.server.services import filtering, liveness
from ember.server.services.columns import RunPage, metric_summary, page_of
from ember.server.services.perms import PUBLIC
from ember.server.storage.db import json_item
from ember.server.storage.domain_errors import Invalid
from ember.server.storage.models import Artifact, Folder, Run, Share, User
from ember.track import query
from ember.track.best import Mode
from ember.track.hparams import flatten

SORT_KEYS = ("name", "status", "start", "duration", "folder")
_SQL_SORTS: dict[str, Any] = {"start": Run.start_time, "name": Run.name, "folder": Folder.path}
"""Sorts the database does (order, count and cut): the others sort the filtered rows in Python."""


def hparam_item(session: Session, key: str) -> ColumnElement[Any]:
    """The hyper-parameter ``key`` of a ``Run`` in SQL; a dotted key (``opt.lr``, as the table flattens
    nested hparams) reads the nested value."""
    parts = key.split(".")
    path = len(parts) > 1 and all(p and not set(p) & set('"\\$[]*') for p in parts)
    return json_item(session, Run.hparams, tuple(parts) if path else key)


def _under(folder: str) -> ColumnElement[bool]:
    """The ``Folder`` is ``folder`` or beneath it."""
    return or_(Folder.path == folder, Folder.path.startswith(folder.rstrip("/") + "/", autoescape=True))


def _to(user: User) -> ColumnElement[bool]:
    return or_(Share.grantee == user.name, Share.grantee == PUBLIC)


def visible_folders(user: User) -> Select[tuple[int]]:
    """The ids of the folders the user may view, as a query: their own tree, and the trees beneath
    folders shared with them or public.

    Read by key from those roots down (``folders.parent_id``), so it costs the folders the user may
    view, not every folder of the server (one user's 100,000 folders used to slow every other
    user's listings).
    """
    granted = select(Share.node_id).where(Share.node_kind == "folder", _to(user))
    roots = select(Folder.id).where(or_(Folder.path == f"/{user.name}", Folder.id.in_(granted)))
    tree = roots.cte("visible_tree", recursive=True)
    tree = tree.union(select(Folder.id).where(Folder.parent_id == tree.c.id))
    return select(tree.c.id)


def visible_folder_ids(session: Session, user: User) -> set[int]:
    """The ids of :func:`visible_folders`."""
    return set(session.scalars(visible_folders(user)))


def visible_condition(
    session: Session,
    user: User,
    model: type[Run] | type[Artifact] = Run,
    folders: set[int] | Select[tuple[int]] | None = None,
) -> ColumnElement[bool]:
    """A WHERE clause on ``model`` (runs, or artifacts) that keeps exactly the nodes the user may view.

    ``folders``: :func:`visible_folder_ids` (read here when None), or the query :func:`visible_folders`.
    """
    kind = "run" if model is Run else "artifact"
    shared = select(Share.node_id).where(Share.node_kind == kind, _to(user))
    folders = visible_folder_ids(session, user) if folders is None else folders
    in_folders = model.folder_id.in_(folders) if isinstance(folders, Select) or folders else false()
    if model is Run:  # a run in the trash is seen by no listing, search or lineage
        return and_(Run.deleted.is_(None), or_(in_folders, model.pk.in_(shared)))
    return or_(in_folders, model.pk.in_(shared))


def filter_of(filters: Sequence[str] = (), q: str = "", label: str = "", status: str = "") -> query.Node | None:
    """The one filter of a listing: the texts (``filters``, each in the language of
    :mod:`ember.track.query`, all of which must hold) and the form's fields: ``q`` a part of the
    name, ``label`` one of the labels, ``status`` the status shown. 422 naming the column of what
    cannot be read.

    Example:
        >>> query.render(filter_of(["hp:lr<0.1 or hp:opt=sgd"], label="base"))
        '(hp:lr < 0.1 or hp:opt = sgd) and label = "base"'
    """
    try:
        parts = [query.parse_all(filters)]
    except query.FilterError as e:
        raise Invalid(str(e), [{"field": "filter", "message": e.reason, "column": e.column}]) from None
    if status and status not in query.STATUSES:
        raise Invalid.field("status", f"{status[:40]!r} is not one of {', '.join(query.STATUSES)}")
    if q:
        parts.append(query.Comparison(query.Field("name"), "~", (query.Value(q, q, True),)))
    if label:
        parts.append(query.Comparison(query.Field("label"), "=", (query.Value(label, label, True),)))
    if status:
        parts.append(query.Comparison(query.Field("status"), "=", (query.Value(status, status),)))
    return query.all_of(parts)


def _in_scope(session: Session, user: User, folder: str | None, beneath: bool = True) -> list[ColumnElement[bool]]:
    """The WHERE clauses (on ``Run`` joined to its ``Folder``) of the runs the user may view in ``folder``
    (and beneath it, unless ``beneath`` is false)."""
    if not folder:
        return [visible_condition(session, user)]
    return [visible_condition(session, user), _under(folder) if beneath else Folder.path == folder]


def _pks(where: list[ColumnElement[bool]]) -> Select[Any]:
    return select(Run.pk).join(Folder, Folder.id == Run.folder_id).where(*where)


def conditions(session: Session, user: User, folder: str | None, tree: query.Node | None) -> list[ColumnElement[bool]]:
    """The WHERE clauses (on ``Run`` joined to its ``Folder``) of the runs the user may view under
    ``folder`` that the filter keeps (:func:`filter_of`; evaluated by :mod:`ember.server.services.filtering`).

    Example:
        >>> session.scalars(select(Run.name).join(Folder).where(*conditions(session, bob, None, tree)))
    """
    scope = _in_scope(session, user, folder)
    return [*scope, _compiler(session, _pks(scope)).condition(tree)]


def _compiler(session: Session, scope: Select[Any]) -> filtering.Compiler:
    """A filter compiler whose Crashed runs are the Running runs of ``scope`` whose process is gone."""

    def crashed() -> set[int]:
        running = list(session.scalars(scope.where(Run.status == "Running")))
        return set(liveness.crashed_runs(session, running))

    return filtering.Compiler(session, crashed)


def why_no_runs(
    session: Session,
    user: User,
    folder: str | None,
    filters: Sequence[str],
    q: str = "",
    label: str = "",
    status: str = "",
) -> list[str]:
    """Why a listing matched no run the user may view (under ``folder``), so that "0 runs" says something.

    Each condition of the filter is counted alone among those runs, in the database
    (:meth:`ember.server.services.filtering.Compiler.evidence`): a key no run has is named (``hp:lrr``),
    a condition none meets says what there is (an hparam's values, up to 8; a metric's range),
    and when each condition alone matches runs, the counts say so
    (:func:`ember.track.query.explain_empty`).

    Returns:
        One sentence per reason, e.g. ``no run here has the hyper-parameter 'lrr'``.
    """
    tree = filter_of(filters, q, label, status)
    if tree is None:
        return []
    scope = _pks(_in_scope(session, user, folder))
    compiler = _compiler(session, scope)
    return query.explain_empty(tree, lambda c: compiler.evidence(c, scope, session))


def _sort_field(sort: str, key: str) -> tuple[str | None, query.Field | None]:
    """The hparam or the metric field a sort key names (``hp:KEY``, ``m:TYPE/NAME[.best|.min|.max]``), or
    neither for the other keys; 422 for a key that is none of them."""
    if key.startswith("hp:"):
        return key[3:], None
    if key.startswith("m:"):
        try:
            return None, query.parse_field(key)
        except query.FilterError as e:
            raise Invalid(f"sort {sort[:80]!r}: {e.reason}") from None
    if key not in SORT_KEYS:
        raise Invalid(f"sort {sort[:80]!r}: use one of {', '.join(SORT_KEYS)}, hp:NAME or m:TYPE/NAME[.best|.min|.max]")
    return None, None


def list_runs(
    session: Session,
    user: User,
    *,
    folder: str | None = None,
    beneath: bool = True,
    q: str = "",
    label: str = "",
    status: str = "",
    filters: list[str] | None = None,
    sort: str = "-start",
    page: int = 1,
    per_page: int = 50,
) -> RunPage:
    """The runs the user may view, filtered, sorted and cut to one page.

    The filter is one WHERE clause (:mod:`ember.server.services.filtering`): the database filters, and,
    sorted by start, name or folder, also sorts, counts and cuts the page, so a page costs what
    one query over the runs' columns costs, never reading a run into Python. The other sorts
    (status, duration, an hparam, a metric's last, best, minimum or maximum) sort the rows the filter kept in
    Python, reading only the column sorted on. The full rows and their metric summaries are
    read for the page's runs alone.

    Args:
        folder: only runs in this folder or beneath it (an absolute path). beneath: False keeps
            the runs of ``folder`` itself (its folder page), not those of its sub-folders.
        q: a part of the name (ASCII letters in either case). label: one of the run's labels.
            status: the status shown (``Crashed``: a Running run whose process is gone, see
            :func:`ember.server.services.liveness.shown_status`).
        filters: filters in the language of :mod:`ember.track.query`, all of which must hold,
            e.g. ``["m:val/acc.best > 0.9 and (hp:lr < 1e-3 or hp:opt = sgd)"]``.
        sort: ``name``, ``status``, ``start``, ``duration``, ``folder``, ``hp:KEY`` or
            ``m:TYPE/NAME`` (its last value; ``m:TYPE/NAME.best``, ``.min``, ``.max``: as the filter
            language reads them, "best" by the run's recorded mode, else the name rule); a leading
            ``-`` sorts descending. A run without the value sorts last either way.

    Raises:
        Invalid: a filter that cannot be read (naming its column), a status or a sort that does not exist.

    Example:
        >>> list_runs(session, bob, q="mnist", filters=["hp:lr<0.1 and m:val/acc>0.9"], sort="-m:val/acc").runs
    """
    tree = filter_of(filters or [], q, label, status)
    descending, sort_key = sort.startswith("-"), sort.lstrip("-") or "start"
    hp_sort, m_sort = _sort_field(sort, sort_key)
    hp_keys = sorted({*filtering.field_keys(tree, "hp"), *([hp_sort] if hp_sort else [])})
    m_keys = sorted({*filtering.field_keys(tree, "m"), *([m_sort.key] if m_sort else [])})
    per_page = max(1, min(per_page, 500))
    columns: list[Any] = [Run.pk, Run.name, Run.status, Run.start_time, Run.end_time, Folder.path]
    scope = _in_scope(session, user, folder, beneath)
    compiler = _compiler(session, _pks(scope))
    if hp_sort is not None:
        columns.append(hparam_item(session, hp_sort))
    elif m_sort is not None:  # the value the filter language reads: last, best, min or max
        columns.append(compiler.metric_value(m_sort))
    stmt = select(*columns).join(Folder, Folder.id == Run.folder_id).where(*scope, compiler.condition(tree))
    if sort_key in _SQL_SORTS:
        # Filtered, sorted, counted and cut by the database (ISO times sort as text), the filter
        # evaluated once: the count rides along with the page (a window over the filtered rows).
        by: Any = _SQL_SORTS[sort_key]
        by = by.collate("C") if session.get_bind().dialect.name != "sqlite" and sort_key != "start" else by
        ordered = stmt.add_columns(func.count().over().label("total"))
        ordered = ordered.order_by(by.is_(None), by.desc() if descending else by.asc(), Run.pk)
        picked = list(session.execute(ordered.offset((page - 1) * per_page).limit(per_page)))
        total = picked[0].total if picked else 0
        if not picked and page > 1:  # past the end: the last page
            total = session.scalar(select(func.count()).select_from(stmt.subquery())) or 0
            page = max(1, math.ceil(total / per_page))
            picked = list(session.execute(ordered.offset((page - 1) * per_page).limit(per_page)))
        live = liveness.crashed_runs(session, [r.pk for r in picked if r.status == "Running"])
    else:
        # Sorted in Python, over the rows the filter kept: the database's tuples until the page is cut.
        picked = list(session.execute(stmt.order_by(Run.pk)))  # ties keep one order, so pages do not overlap
        live = liveness.crashed_runs(session, [r.pk for r in picked if r.status == "Running"])
        picked = _sorted(picked, descending, _sort_value(sort_key, live))
        total = len(picked)
        page = max(1, min(page, math.ceil(total / per_page)))
        picked = picked[(page - 1) * per_page : page * per_page]
    chosen = [_row(r, live) for r in picked]
    modes = _fill_page(session, chosen)
    return page_of(total, page, per_page, chosen, hp_keys, m_keys, modes)


def table_of(session: Session, run_ids: list[str], total: int, per_page: int) -> RunPage:
    """The runs table's rows for these runs, in this order (the caller checked the right to view them).

    What the console's folder page shows of one page of ``GET /api/v1/folders``: the same columns
    as :func:`list_runs` (Crashed for a Running run whose process is gone, last and best metrics).
    """
    columns = [Run.pk, Run.name, Run.status, Run.start_time, Run.end_time, Folder.path, Run.id]
    found = {
        r.id: r
        for r in session.execute(select(*columns).join(Folder, Folder.id == Run.folder_id).where(Run.id.in_(run_ids)))
    }
    picked = [found[i] for i in run_ids if i in found]
    live = liveness.crashed_runs(session, [r.pk for r in picked if r.status == "Running"])
    chosen = [_row(r, live) for r in picked]
    modes = _fill_page(session, chosen)
    return page_of(total, 1, per_page, chosen, [], [], modes)


def _row(r: Sequence[Any], live: dict[int, tuple[str, Any]]) -> dict[str, Any]:
    """A row of the candidate query as a dict (:func:`_fill_page` completes it)."""
    status, end = live.get(r[0], (r[2], r[4]))
    return {"pk": r[0], "name": r[1], "status": status, "start_time": r[3], "end_time": end, "folder": r[5]}


def _status(r: Sequence[Any], live: dict[int, tuple[str, Any]]) -> str:
    return live[r[0]][0] if r[0] in live else r[2]


def _sort_value(key: str, live: dict[int, tuple[str, Any]]) -> Callable[[Sequence[Any]], Any]:
    """What a candidate row is sorted by, for sort key ``key`` (validated by the caller; an hparam's
    or a metric's value is the row's seventh column)."""
    if key.startswith(("hp:", "m:")):
        return operator.itemgetter(6)
    if key == "status":
        return lambda r: _status(r, live)
    if key == "duration":  # a Running run's: so far
        return lambda r: liveness.duration_s(
            r[3], live[r[0]][1] if r[0] in live else r[4], _status(r, live) == "Running"
        )
    return operator.itemgetter({"name": 1, "start": 3, "folder": 5}[key])


def _fill_page(session: Session, chosen: list[dict[str, Any]]) -> dict[str, Mode]:
    """Complete one page's rows: id, labels, every hparam, the status's reason, metric summaries; drop
    the pk. Returns each metric's mode (:attr:`ember.server.services.columns.Summaries.modes`)."""
    by_pk = {r["pk"]: r for r in chosen}
    if by_pk:
        reason = json_item(session, Run.meta, "reason")
        for pk, id_, labels, hparams, why in session.execute(
            select(Run.pk, Run.id, Run.labels, Run.hparams, reason).where(Run.pk.in_(list(by_pk)))
        ):
            why = why if isinstance(why, str) else None
            flat = flatten(hparams) if isinstance(hparams, dict) else {}
            by_pk[pk].update(id=id_, labels=list(labels or []), hparams=flat, reason=why)
    summary = metric_summary(session, list(by_pk))
    for r in chosen:
        r["metrics"] = summary.values.get(r["pk"], {})
        r["duration"] = liveness.duration_s(r["start_time"], r["end_time"], r["status"] == "Running")
        r.pop("pk")
    return summary.modes


def _sorted(rows: list[Any], descending: bool, get: Callable[[Any], Any]) -> list[Any]:
    keyed = [(query.order_key(get(r)), r) for r in rows]
    present = [(k, r) for k, r in keyed if k is not None]
    missing = [r for k, r in keyed if k is None]  # always last, whichever the direction
    present.sort(key=operator.itemgetter(0), reverse=descending)
    return [r for _, r in present] + missing
