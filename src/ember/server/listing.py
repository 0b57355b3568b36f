"""Queries behind the runs table: visible runs, filters, sorting, last and best metrics.

Shared by the REST API (``GET /api/v1/runs``) and the console. Every
listing starts from :func:`visible_runs`, the one place that decides which runs a user may see,
so a filter or a sort can never reach a run the caller has no view right on.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fastapi import HTTPException
from sqlalchemy import ColumnElement, false, func, or_, select, tuple_
from sqlalchemy.orm import Session

from ember.server.models import Folder, MetricPoint, Run, Share, User
from ember.server.perms import PUBLIC, ancestors

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
_LOWER_IS_BETTER = re.compile(r"loss|err|perplex|mse|mae|rmse|nll|time", re.IGNORECASE)
SORT_KEYS = ("name", "status", "start", "duration", "folder")


def _to(user: User) -> ColumnElement[bool]:
    return or_(Share.grantee == user.name, Share.grantee == PUBLIC)


def visible_folder_ids(session: Session, user: User) -> set[int]:
    """Folders the user may view: owned or shared (directly or through a parent), or public."""
    rows = session.execute(select(Folder.id, Folder.path, Folder.owner_id)).all()
    granted = set(session.scalars(select(Share.node_id).where(Share.node_kind == "folder", _to(user))))
    open_paths = {path for fid, path, owner in rows if owner == user.id or fid in granted}
    return {fid for fid, path, _ in rows if any(a in open_paths for a in ancestors(path))}


def visible_condition(session: Session, user: User) -> ColumnElement[bool]:
    """A WHERE clause on ``Run`` that keeps exactly the runs the user may view."""
    shared = select(Share.node_id).where(Share.node_kind == "run", _to(user))
    folders = visible_folder_ids(session, user)
    in_folders = Run.folder_id.in_(folders) if folders else false()
    return or_(Run.owner_id == user.id, in_folders, Run.pk.in_(shared))


def parse_filter(text: str) -> tuple[str, str, str, Any]:
    """``hp:lr>=0.01`` or ``m:val/acc>0.9`` -> (kind, key, op, value); 422 on anything else."""
    match = _FILTER.match(text.strip())
    if not match:
        raise HTTPException(
            422,
            f"filter {text[:80]!r} is not understood: write hp:NAME OP VALUE or m:TYPE/NAME OP VALUE, "
            "with OP one of = != < <= > >= ~ (contains), e.g. hp:lr>=0.01 or m:val/acc>0.9",
        )
    kind, key, op, raw = match.groups()
    if kind == "m" and "/" not in key:
        raise HTTPException(422, f"metric filter {text[:80]!r}: name the metric as TYPE/NAME, e.g. m:train/loss<0.5")
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


def duration_s(start: str | None, end: str | None) -> float | None:
    """Seconds between two ISO 8601 times (None when either is missing or unreadable)."""
    try:
        a = datetime.fromisoformat(start) if start else None
        b = datetime.fromisoformat(end) if end else None
    except ValueError:
        return None
    if a is None or b is None or (a.tzinfo is None) != (b.tzinfo is None):
        return None
    return max(0.0, (b - a).total_seconds())


def metric_summary(session: Session, run_pks: list[int]) -> dict[int, dict[str, dict[str, float | None]]]:
    """Per run, per ``type/name``: the last value (at the highest step) and the best one."""
    if not run_pks:
        return {}
    agg = session.execute(
        select(
            MetricPoint.run_pk,
            MetricPoint.type,
            MetricPoint.name,
            func.max(MetricPoint.step),
            func.min(MetricPoint.value),
            func.max(MetricPoint.value),
        )
        .where(MetricPoint.run_pk.in_(run_pks))
        .group_by(MetricPoint.run_pk, MetricPoint.type, MetricPoint.name)
    ).all()
    out: dict[int, dict[str, dict[str, float | None]]] = {pk: {} for pk in run_pks}
    for pk, type_, name, _, lo, hi in agg:
        out[pk][f"{type_}/{name}"] = {"last": None, "best": lo if _LOWER_IS_BETTER.search(name) else hi}
    keys = [(pk, t, s, n) for pk, t, n, s, _, _ in agg]
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        rows = session.execute(
            select(MetricPoint.run_pk, MetricPoint.type, MetricPoint.name, MetricPoint.value).where(
                tuple_(MetricPoint.run_pk, MetricPoint.type, MetricPoint.step, MetricPoint.name).in_(chunk)
            )
        ).all()
        for pk, type_, name, value in rows:
            out[pk][f"{type_}/{name}"]["last"] = value
    return out


@dataclass
class RunPage:
    """One page of the runs table."""

    total: int
    page: int
    per_page: int
    runs: list[dict[str, Any]]
    hparam_keys: list[str]
    metric_keys: list[str]


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

    Args:
        folder: only runs in this folder or beneath it (an absolute path).
        q: a case-insensitive part of the name. label, status: exact matches.
        filters: ``hp:KEY OP VALUE`` / ``m:TYPE/NAME OP VALUE`` (the metric's last value).
        sort: ``name``, ``status``, ``start``, ``duration``, ``folder``, ``hp:KEY`` or
            ``m:TYPE/NAME``; a leading ``-`` sorts descending.

    Example:
        >>> list_runs(session, bob, q="mnist", filters=["hp:lr<0.1"], sort="-m:val/acc").runs
    """
    parsed = [parse_filter(f) for f in filters or [] if f.strip()]
    stmt = (
        select(Run.pk, Run.id, Run.name, Run.status, Run.start_time, Run.end_time, Run.labels, Run.hparams, Folder.path)
        .join(Folder, Folder.id == Run.folder_id)
        .where(visible_condition(session, user))
    )
    if folder:
        stmt = stmt.where(or_(Folder.path == folder, Folder.path.startswith(folder.rstrip("/") + "/", autoescape=True)))
    if q:
        stmt = stmt.where(func.lower(Run.name).contains(q.lower(), autoescape=True))
    if status:
        stmt = stmt.where(Run.status == status)
    rows = [
        {
            "pk": r[0],
            "id": r[1],
            "name": r[2],
            "status": r[3],
            "start_time": r[4],
            "end_time": r[5],
            "labels": list(r[6] or []),
            "hparams": dict(r[7] or {}),
            "folder": r[8],
            "duration": duration_s(r[4], r[5]),
        }
        for r in session.execute(stmt)
    ]
    if label:
        rows = [r for r in rows if label in r["labels"]]
    rows = [r for r in rows if all(_matches(r["hparams"].get(k), op, v) for kind, k, op, v in parsed if kind == "hp")]
    need_metrics = any(kind == "m" for kind, *_ in parsed) or sort.lstrip("-").startswith("m:")
    if need_metrics:
        summary = metric_summary(session, [r["pk"] for r in rows])
        for r in rows:
            r["metrics"] = summary.get(r["pk"], {})
        rows = [
            r
            for r in rows
            if all(_matches(r["metrics"].get(k, {}).get("last"), op, v) for kind, k, op, v in parsed if kind == "m")
        ]
    rows = _sorted(rows, sort)
    per_page = max(1, min(per_page, 500))
    pages = max(1, math.ceil(len(rows) / per_page))
    page = max(1, min(page, pages))
    chosen = rows[(page - 1) * per_page : page * per_page]
    if not need_metrics:
        summary = metric_summary(session, [r["pk"] for r in chosen])
        for r in chosen:
            r["metrics"] = summary.get(r["pk"], {})
    hp_keys = sorted({k for r in chosen for k in r["hparams"]})[:8]
    m_keys = sorted({k for r in chosen for k in r["metrics"]}, key=_metric_order)[:8]
    for r in chosen:
        r.pop("pk")
    return RunPage(len(rows), page, per_page, chosen, hp_keys, m_keys)


def _metric_order(key: str) -> tuple[int, str]:
    return ({"train": 0, "val": 1, "test": 2}.get(key.split("/", 1)[0], 3), key)


def _sorted(rows: list[dict[str, Any]], sort: str) -> list[dict[str, Any]]:
    descending = sort.startswith("-")
    key = sort.lstrip("-") or "start"
    if key.startswith("hp:"):
        name = key[3:]
        get: Callable[[dict[str, Any]], Any] = lambda r: r["hparams"].get(name)  # noqa: E731
    elif key.startswith("m:"):
        name = key[2:]
        get = lambda r: r["metrics"].get(name, {}).get("last")  # noqa: E731
    elif key in SORT_KEYS:
        field = {"start": "start_time"}.get(key, key)
        get = lambda r: r[field]  # noqa: E731
    else:
        raise HTTPException(422, f"sort {sort[:80]!r}: use one of {', '.join(SORT_KEYS)}, hp:NAME or m:TYPE/NAME")
    present = [r for r in rows if _comparable(get(r)) is not None]
    missing = [r for r in rows if _comparable(get(r)) is None]  # always last, whichever the direction
    present.sort(key=lambda r: _comparable(get(r)), reverse=descending)  # type: ignore[arg-type,return-value]
    return present + missing


def _comparable(value: Any) -> tuple[int, Any] | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, bool | int | float):
        return (0, float(value))
    return (1, str(value))
