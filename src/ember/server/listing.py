"""Queries behind the runs table: visible runs, filters, sorting, last and best metrics.

Shared by the REST API (``GET /api/v1/runs``) and the console. Every
listing starts from :func:`visible_runs`, the one place that decides which runs a user may see,
so a filter or a sort can never reach a run the caller has no view right on.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, ScalarSelect, Select, false, func, or_, select
from sqlalchemy.orm import Session

from ember.server import liveness
from ember.server.columns import RunPage, metric_summary, page_of
from ember.server.db import json_item
from ember.server.domain_errors import Invalid
from ember.server.models import Artifact, Folder, MetricBlock, MetricPoint, Run, Share, User
from ember.server.perms import PUBLIC
from ember.track.best import Mode
from ember.track.hparams import flatten

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "!=": operator.ne,
    "=": operator.eq,
    ">": operator.gt,
    "<": operator.lt,
    "~": lambda a, b: str(b).lower() in str(a).lower(),
}
_FILTER = re.compile(r"^(hp|m):([^<>=!~]{1,300}?)\s*(>=|<=|!=|=|>|<|~)\s*(.{0,300})$")
SORT_KEYS = ("name", "status", "start", "duration", "folder")


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
    return or_(in_folders, model.pk.in_(shared))


def parse_filter(text: str) -> tuple[str, str, str, Any]:
    """``hp:lr>=0.01`` or ``m:val/acc>0.9`` -> (kind, key, op, value); 422 on anything else."""
    match = _FILTER.match(text.strip())
    if not match:
        raise Invalid(
            f"filter {text[:80]!r} is not understood: write hp:NAME OP VALUE or m:TYPE/NAME OP VALUE, "
            "with OP one of = != < <= > >= ~ (contains), e.g. hp:lr>=0.01 or m:val/acc>0.9",
        )
    kind, key, op, raw = match.groups()
    if kind == "m" and "/" not in key:
        raise Invalid(f"metric filter {text[:80]!r}: name the metric as TYPE/NAME, e.g. m:train/loss<0.5")
    return kind, key.strip(), op, _number(raw.strip())


def _number(raw: str) -> Any:
    try:
        return float(raw)
    except ValueError:
        return raw


def _matches(value: Any, op: str, wanted: Any) -> bool:
    if value is None:
        return False
    if isinstance(wanted, float) and op != "~":
        try:
            return bool(_OPS[op](float(value), wanted))
        except (TypeError, ValueError):
            return False
    return bool(_OPS[op](str(value), str(wanted)) if op != "~" else _OPS[op](value, wanted))


def _last_value(key: str) -> ScalarSelect[Any]:
    """The value of metric ``TYPE/NAME`` at its highest step, for the ``Run`` of the outer query.

    One probe of the points' primary key (run, type, name, step) per run: no scan.
    """
    type_, _, name = key.partition("/")
    return (
        select(MetricPoint.value)
        .where(MetricPoint.run_pk == Run.pk, MetricPoint.type == type_, MetricPoint.name == name)
        .order_by(MetricPoint.step.desc())
        .limit(1)
        .scalar_subquery()
    )


def why_no_runs(session: Session, user: User, folder: str | None, filters: list[str]) -> list[str]:
    """Why the filters matched no run the user may view (under ``folder``): a typo, or which values there are.

    Called when the filters matched nothing, so that "0 runs" says something: a key no run has
    (``hp:lrr``, a metric not named TYPE/NAME) is named, and for an hparam that exists, the values
    the runs hold (up to 8). An hparam is looked for in each run's flattened hparams, a metric with
    one probe of the block summaries.

    Returns:
        One sentence per key, e.g. ``no run here has the hyper-parameter 'lrr'``.
    """
    scope = select(Run.pk).join(Folder, Folder.id == Run.folder_id).where(visible_condition(session, user))
    if folder:
        scope = scope.where(_under(folder))
    out = []
    for kind, key in sorted({(kind, key) for kind, key, _, _ in (parse_filter(f) for f in filters if f.strip())}):
        if kind == "m":
            type_, _, name = key.partition("/")
            probe = select(MetricBlock.run_pk).where(
                MetricBlock.run_pk.in_(scope), MetricBlock.type == type_, MetricBlock.name == name
            )
            if session.scalar(probe.limit(1)) is None:
                out.append(f"no run here has the metric {key!r} (write it as TYPE/NAME, e.g. val/acc)")
            continue
        values: dict[str, None] = {}
        for (hparams,) in session.execute(
            select(Run.hparams).where(Run.pk.in_(scope)).execution_options(yield_per=500)
        ):
            flat = flatten(hparams) if isinstance(hparams, dict) else {}
            if key in flat:
                values[json.dumps(flat[key], sort_keys=True)[:60]] = None
                if len(values) > 8:
                    break
        if not values:
            out.append(f"no run here has the hyper-parameter {key!r} (nested ones are written as opt.lr)")
        else:
            more = ", ..." if len(values) > 8 else ""
            out.append(f"no run matches; {key} here is one of {', '.join(list(values)[:8])}{more}")
    return out


def list_runs(
    session: Session,
    user: User,
    *,
    folder: str | None = None,
    q: str = "",
    label: str = "",
    status: str = "",
    filters: list[str] | None = None,
    sort: str = "-start",
    page: int = 1,
    per_page: int = 50,
) -> RunPage:
    """The runs the user may view, filtered, sorted and cut to one page.

    Filtering and sorting read only the columns they need (an hparam is read out of the JSON by
    the database, a metric's last value by one index probe per run); the full rows and their
    metric summaries are read for the page's runs alone, so 10,000 runs stay fast.

    Args:
        folder: only runs in this folder or beneath it (an absolute path).
        q: a case-insensitive part of the name. label, status: exact matches (``Crashed``
            selects the Running runs whose process is gone, see :func:`shown_status`).
        filters: ``hp:KEY OP VALUE`` / ``m:TYPE/NAME OP VALUE`` (the metric's last value).
        sort: ``name``, ``status``, ``start``, ``duration``, ``folder``, ``hp:KEY`` or
            ``m:TYPE/NAME``; a leading ``-`` sorts descending.

    Example:
        >>> list_runs(session, bob, q="mnist", filters=["hp:lr<0.1"], sort="-m:val/acc").runs
    """
    parsed = [parse_filter(f) for f in filters or [] if f.strip()]
    descending, sort_key = sort.startswith("-"), sort.lstrip("-") or "start"
    if not (sort_key in SORT_KEYS or sort_key.startswith(("hp:", "m:"))):
        raise Invalid(f"sort {sort[:80]!r}: use one of {', '.join(SORT_KEYS)}, hp:NAME or m:TYPE/NAME")
    hp_keys = sorted(
        {k for kind, k, _, _ in parsed if kind == "hp"} | ({sort_key[3:]} if sort_key.startswith("hp:") else set())
    )
    m_keys = sorted(
        {k for kind, k, _, _ in parsed if kind == "m"} | ({sort_key[2:]} if sort_key.startswith("m:") else set())
    )
    per_page = max(1, min(per_page, 500))
    columns: list[Any] = [Run.pk, Run.name, Run.status, Run.start_time, Run.end_time, Folder.path]
    columns += [hparam_item(session, k).label(f"hp{i}") for i, k in enumerate(hp_keys)]
    columns += [_last_value(k).label(f"m{i}") for i, k in enumerate(m_keys)]
    if label:
        columns.append(Run.labels)
    stmt = select(*columns).join(Folder, Folder.id == Run.folder_id).where(visible_condition(session, user))
    if folder:
        stmt = stmt.where(_under(folder))
    if q:
        stmt = stmt.where(func.lower(Run.name).contains(q.lower(), autoescape=True))
    if status:
        stmt = stmt.where(Run.status == ("Running" if status == "Crashed" else status))
    if not parsed and not label and status not in ("Running", "Crashed") and sort_key == "start":
        # The default listing: sorted, counted and cut in the database (ISO times sort as text).
        total = session.scalar(select(func.count()).select_from(stmt.order_by(None).subquery())) or 0
        page = max(1, min(page, math.ceil(total / per_page)))
        when = Run.start_time.desc() if descending else Run.start_time.asc()
        stmt = stmt.order_by(Run.start_time.is_(None), when, Run.pk).offset((page - 1) * per_page).limit(per_page)
        picked = list(session.execute(stmt))
        live = liveness.crashed_runs(session, [r.pk for r in picked if r.status == "Running"])
    else:
        # Rows stay the database's tuples until the page is cut: 10,000 dicts would cost more than the query.
        picked = list(session.execute(stmt.order_by(Run.pk)))  # ties keep one order, so pages do not overlap
        if label:
            picked = [r for r in picked if label in (r.labels or [])]
        n_hp = len(hp_keys)
        checks = [
            (6 + (hp_keys.index(k) if kind == "hp" else n_hp + m_keys.index(k)), op, v) for kind, k, op, v in parsed
        ]
        if checks:
            picked = [r for r in picked if all(_matches(r[i], op, v) for i, op, v in checks)]
        live = liveness.crashed_runs(session, [r.pk for r in picked if r.status == "Running"])
        if status:
            picked = [r for r in picked if _status(r, live) == status]
        picked = _sorted(picked, descending, _sort_value(sort_key, hp_keys, m_keys, live))
        total = len(picked)
        page = max(1, min(page, math.ceil(total / per_page)))
        picked = picked[(page - 1) * per_page : page * per_page]
    chosen = [_row(r, hp_keys, m_keys, live) for r in picked]
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
    chosen = [_row(r, [], [], live) for r in picked]
    modes = _fill_page(session, chosen)
    return page_of(total, 1, per_page, chosen, [], [], modes)


def _row(r: Sequence[Any], hp_keys: list[str], m_keys: list[str], live: dict[int, tuple[str, Any]]) -> dict[str, Any]:
    """A row of the candidate query as a dict; ``hparams``/``metrics`` hold only the keys asked for."""
    status, end = live.get(r[0], (r[2], r[4]))
    return {
        "pk": r[0],
        "name": r[1],
        "status": status,
        "start_time": r[3],
        "end_time": end,
        "folder": r[5],
        "hparams": {k: r[6 + i] for i, k in enumerate(hp_keys)},
        "metrics": {k: {"last": r[6 + len(hp_keys) + i]} for i, k in enumerate(m_keys)},
    }


def _status(r: Sequence[Any], live: dict[int, tuple[str, Any]]) -> str:
    return live[r[0]][0] if r[0] in live else r[2]


def _sort_value(
    key: str, hp_keys: list[str], m_keys: list[str], live: dict[int, tuple[str, Any]]
) -> Callable[[Sequence[Any]], Any]:
    """What a candidate row is sorted by, for sort key ``key`` (validated by the caller)."""
    if key.startswith("hp:"):
        return operator.itemgetter(6 + hp_keys.index(key[3:]))
    if key.startswith("m:"):
        return operator.itemgetter(6 + len(hp_keys) + m_keys.index(key[2:]))
    if key == "status":
        return lambda r: _status(r, live)
    if key == "duration":
        return lambda r: liveness.duration_s(r[3], live[r[0]][1] if r[0] in live else r[4])
    return operator.itemgetter({"name": 1, "start": 3, "folder": 5}[key])


def _fill_page(session: Session, chosen: list[dict[str, Any]]) -> dict[str, Mode]:
    """Complete one page's rows: id, labels, every hparam, the status's reason, metric summaries; drop
    the pk. Returns each metric's mode (:attr:`ember.server.columns.Summaries.modes`)."""
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
        r["duration"] = liveness.duration_s(r["start_time"], r["end_time"])
        r.pop("pk")
    return summary.modes


def _sorted(rows: list[Any], descending: bool, get: Callable[[Any], Any]) -> list[Any]:
    keyed = [(_comparable(get(r)), r) for r in rows]
    present = [(k, r) for k, r in keyed if k is not None]
    missing = [r for k, r in keyed if k is None]  # always last, whichever the direction
    present.sort(key=operator.itemgetter(0), reverse=descending)
    return [r for _, r in present] + missing


def _comparable(value: Any) -> tuple[int, Any] | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, bool | int | float):
        return (0, float(value))
    return (1, str(value))
