"""The compare page: runs side by side, every shared metric in a grid, hparams against a metric.

``/ui/compare?ids=A&ids=B...`` (the runs ticked in the runs table) or ``?folder=/alice/sweep``
(every run of a folder and beneath, newest first): up to :data:`MAX_RUNS` runs. The page holds
the runs' flattened hparams, metric summaries and each metric's best (over every run compared) as
JSON for ``compare.js``, which draws the line charts of every run with uPlot (the series of many
runs fetched a type at a time, each downsampled to its share, see :func:`buckets_per_run`), and
the parallel coordinates and the scatter with plotly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response
from sqlalchemy import select

from ember.server.api.auth import DbSession
from ember.server.console.assets import VERSION
from ember.server.console.session import PREFIX, require_viewer
from ember.server.console.views import ConsoleRoute, render
from ember.server.services import listing, liveness, naming
from ember.server.services.columns import metric_order, metric_summary
from ember.server.services.lookup import get_runs
from ember.server.services.series import COMPARE_IDS
from ember.server.storage.models import Run
from ember.track.best import Mode, metric_mode
from ember.track.hparams import flatten

router = APIRouter(prefix=PREFIX, route_class=ConsoleRoute, include_in_schema=False)
MAX_RUNS = 500
POINTS = 6_000
"""About how many step ranges a line chart draws in all (each kept as its min and max): each run's
series is downsampled to its share, at most 1,000 and at least 100, so 60 runs load about as fast
as 6 (60 x 2,000 points: 1.29 s warm at 20,000, see benchmarks/console_compare.py)."""


TABLEAU = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")


def palette(n: int) -> list[str]:
    """``n`` colours, all different: Tableau 10 first, then hues a golden angle apart at three lightnesses.

    Example:
        >>> len(set(palette(300)))
        300
    """
    out = list(TABLEAU[:n])
    for i in range(n - len(out)):
        hue = (i * 137.508 + 20) % 360
        out.append(f"hsl({hue:.1f}, {(70, 55, 85)[i % 3]}%, {(42, 30, 58)[(i // 3) % 3]}%)")
    return out


def compare_order(key: str) -> tuple[int, tuple[int, str]]:
    """Losses first (``train/loss``, ``val/loss``, then other ``*loss*``), then train, val, test, others."""
    name = key.rsplit("/", 1)[-1].lower()
    return (0 if name == "loss" else 1 if "loss" in name else 2, metric_order(key))


def _plain(value: Any) -> Any:
    """A value JSON can carry to the page (non-finite floats as None; containers as their text)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple, dict)):
        return repr(value)
    return value


def best_runs(
    runs: list[Run],
    summary: Mapping[int, Mapping[str, Mapping[str, Any]]],
    metrics: list[str],
    modes: dict[str, Mode] | None = None,
) -> dict[str, frozenset[str]]:
    """Per metric, the ids of the runs holding the best value: every run that ties for it, not
    only the first. ``modes``: the page's mode of each metric (the runs' recorded one, see
    :func:`ember.server.services.columns.metric_summary`); a metric not in it goes by its name
    (``ember.track.best.metric_mode``)."""
    out = {}
    for m in metrics:
        held = [(s["best"], r.id) for r in runs if (s := summary[r.pk].get(m)) and _plain(s.get("best")) is not None]
        if held:
            pick = min if (modes or {}).get(m, metric_mode(m)) == "min" else max
            top = pick(value for value, _ in held)
            out[m] = frozenset(run_id for value, run_id in held if value == top)
    return out


def buckets_per_run(runs: int) -> int:
    """The downsampling of each run's series on a compare page of ``runs`` runs (see :data:`POINTS`).

    Example:
        >>> buckets_per_run(2), buckets_per_run(20), buckets_per_run(60)
        (1000, 300, 100)
    """
    return max(100, min(1000, POINTS // max(1, runs)))


def best_points(
    runs: list[Run], summary: Mapping[int, Mapping[str, Mapping[str, Any]]], best: Mapping[str, frozenset[str]]
) -> dict[str, dict[str, Any]]:
    """Per metric, the best value over every run compared and the ids of the runs that hold it
    (newest first), for the charts' titles and stars."""
    out = {}
    for m, ids in best.items():
        holders = [r for r in runs if r.id in ids]
        out[m] = {"value": _plain(summary[holders[0].pk][m]["best"]), "runs": [r.id for r in holders]}
    return out


def series_urls(metrics: list[str], ids: list[str], buckets: int) -> dict[str, list[str]]:
    """The ``/compare/series`` requests of each metric type the charts draw, :data:`COMPARE_IDS` runs each.

    compare.js fetches exactly these URLs, and the page names them in ``<link rel="preload">`` at its
    top: the browser asks for the series while it still parses the page and its scripts (plotly.js
    alone takes ~0.15 s), and the script's fetch takes the answer already on its way.
    """
    types = dict.fromkeys(m.split("/", 1)[0] for m in metrics if "/" in m)
    return {
        t: [
            f"{PREFIX}/compare/series?{urlencode({'type': t, 'buckets': buckets})}"
            + "".join(f"&ids={quote(i, safe='')}" for i in ids[at : at + COMPARE_IDS])
            for at in range(0, len(ids), COMPARE_IDS)
        ]
        for t in types
    }


def _runs(session: Any, user: Any, ids: list[str], folder: str | None) -> list[Run]:
    """The runs named by id (each checked), or those of a folder and beneath that the viewer may see."""
    if not folder:
        return get_runs(session, user, ids)
    path = naming.folder_path(folder, home=f"/{user.name}")
    found = [row["id"] for row in listing.list_runs(session, user, folder=path, per_page=MAX_RUNS).runs]
    rows = {r.id: r for r in session.scalars(select(Run).where(Run.id.in_(found)))}
    return [rows[i] for i in found if i in rows]


@router.get("/compare")
def compare_page(
    request: Request,
    session: DbSession,
    ids: Annotated[list[str] | None, Query(max_length=MAX_RUNS)] = None,
    folder: Annotated[str | None, Query(max_length=1000)] = None,
) -> Response:
    user = require_viewer(request, session)
    runs = _runs(session, user, list(dict.fromkeys(ids or [])), folder)
    if len(runs) < 2:
        raise HTTPException(422, "pick at least two runs to compare (tick them in the runs table)")
    if len(runs) > MAX_RUNS:
        raise HTTPException(422, f"compare up to {MAX_RUNS} runs at once, not {len(runs)}")
    summaries = metric_summary(session, [r.pk for r in runs])
    summary = summaries.values
    flat = {r.pk: flatten(r.hparams) if isinstance(r.hparams, dict) else {} for r in runs}
    keys = sorted({k for r in runs for k in flat[r.pk]})
    differing = [k for k in keys if len({repr(flat[r.pk].get(k)) for r in runs}) > 1]
    same = [(k, flat[runs[0].pk].get(k)) for k in keys if k not in differing]
    counts: dict[str, int] = {}
    for r in runs:
        for m in summary[r.pk]:
            counts[m] = counts.get(m, 0) + 1
    metrics = sorted(counts, key=compare_order)
    shared = [m for m in metrics if counts[m] >= 2] or metrics
    modes = {m: summaries.modes[m] for m in metrics}
    colors = palette(len(runs))
    best = best_runs(runs, summary, metrics, modes)
    data = {
        "prefix": PREFIX,
        "runs": [
            {
                "id": r.id,
                "color": colors[i],
                "name": r.name,
                "hparams": {k: _plain(flat[r.pk].get(k)) for k in differing},
                "metrics": {m: {k: _plain(v) for k, v in s.items()} for m, s in summary[r.pk].items()},
            }
            for i, r in enumerate(runs)
        ],
        "hparams": differing,
        "metrics": metrics,
        "shared": shared,
        "modes": modes,
        "best": best_points(runs, summary, best),
        "buckets": buckets_per_run(len(runs)),
        "series": series_urls(shared, [r.id for r in runs], buckets_per_run(len(runs))),
    }
    return render(
        request,
        "compare.html",
        user=user,
        runs=runs,
        flat=flat,
        summary=summary,
        differing=differing,
        same=same,
        metrics=metrics,
        modes=data["modes"],
        best=best,
        statuses={r.id: liveness.shown_status(r.status, r.meta) for r in runs},
        data=data,
        folder=folder,
        asset_v=VERSION,
    )
