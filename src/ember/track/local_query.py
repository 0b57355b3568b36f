"""The filter language (:mod:`ember.track.query`) over the local store: what ``ember runs ls --filter`` runs.

The Python evaluator reads a run's ``run.json`` and, of the metrics a filter names, their files
(:func:`run_facts`); the server and ``ember ui`` answer the same filters in SQL
(:mod:`ember.server.services.filtering`), with the same results over the same runs.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ember.errors import TrackingError
from ember.track import query
from ember.track.best import recorded_modes
from ember.track.store import RunInfo, metric_batches


@dataclass(frozen=True)
class Selection:
    """What :func:`select_runs` found: the runs kept, why none was (when none was), and the runs whose
    metrics could not be read to check them (``"<folder>: <why>"``)."""

    kept: list[RunInfo]
    why_none: list[str]
    unreadable: list[str]


def select_runs(tree: query.Node | None, infos: Sequence[RunInfo]) -> Selection:
    """The runs the filter keeps, in their order; when none, why (:func:`ember.track.query.explain_empty`).

    Example:
        >>> select_runs(query.parse("hp:lr < 1e-3"), list_runs(home)).kept
    """
    names = query.metrics_named(tree)
    facts, unreadable = [], []
    for info in infos:
        found, damage = run_facts(info, names)
        facts.append(found)
        if damage is not None:
            unreadable.append(f"{info.folder}: {damage}")
    kept = [info for info, f in zip(infos, facts, strict=True) if query.matches(tree, f)]
    why = [] if kept or tree is None else query.explain_empty(tree, lambda c: query.evidence(c, facts))
    return Selection(kept, why, unreadable)


SORT_KEYS = ("name", "status", "start", "duration", "folder")
"""What ``ember runs ls --sort`` sorts by besides ``hp:KEY`` and ``m:TYPE/NAME[.last|.best|.min|.max]``."""


def sort_runs(infos: Sequence[RunInfo], sort: str, now: float | None = None) -> list[RunInfo]:
    """The runs in the order of ``sort``, as the server's runs table sorts them.

    Args:
        sort: ``name``, ``status``, ``start``, ``duration``, ``folder``, ``hp:KEY`` (a nested one with
            dots) or ``m:TYPE/NAME`` (its last value; ``.best``, ``.min``, ``.max``: what a filter on
            ``m:TYPE/NAME.best`` reads); a leading ``-`` sorts descending. Runs without the value
            (no such hparam or metric, a NaN) come last either way; numbers before text.
        now: the time a Running run's duration counts to (default: now).

    Raises:
        TrackingError: a sort key that is none of these (a metric key that cannot be read names its column).

    Example:
        >>> [i.folder for i in sort_runs(list_runs(home), "-m:val/acc.best")]
    """
    descending, key = sort.startswith("-"), sort.removeprefix("-")
    values: list[Any]
    if key.startswith("m:"):
        try:
            fld = query.parse_field(key)
        except query.FilterError as e:
            raise TrackingError(f"--sort {sort!r}: {e.reason}") from None
        facts = [run_facts(info, [fld.key])[0].metrics.get(fld.key) for info in infos]
        values = [None if f is None else f.value(fld.agg) for f in facts]
    elif key.startswith("hp:"):
        found = [query.lookup(info.meta.get("hparams"), key[3:]) for info in infos]
        values = [v if present else None for present, v in found]
    elif key in SORT_KEYS:
        at = {"name": "name", "start": "start_time", "folder": "folder"}.get(key)
        values = [info.meta.get(at) if at else info.status if key == "status" else info.duration(now) for info in infos]
    else:
        keys = ", ".join(SORT_KEYS)
        raise TrackingError(
            f"--sort {sort!r}: use one of {keys}, hp:KEY or m:TYPE/NAME[.best|.min|.max] (- first: descending)"
        )
    keyed = [(query.order_key(v), info) for v, info in zip(values, infos, strict=True)]
    present = sorted(((k, i) for k, i in keyed if k is not None), key=lambda p: p[0], reverse=descending)
    return [i for _, i in present] + [i for k, i in keyed if k is None]


def run_facts(info: RunInfo, metrics: Sequence[str]) -> tuple[query.RunFacts, str | None]:
    """What a filter reads of a local run (:func:`ember.track.query.matches`), and why some of it could not be read.

    Its run.json and, of the ``metrics`` (``TYPE/NAME``), the value at the highest step, the
    minimum and the maximum. A metric file is read a chunk at a time; a step logged twice counts
    once, its first point, as the server stores it. A metrics file that cannot be read (damaged)
    leaves its metrics out, so no condition on them holds, and the second value says why.

    Example:
        >>> facts, _ = run_facts(run_info(path), ["val/acc"])
        >>> query.matches(query.parse("m:val/acc.best > 0.9"), facts)
        True
    """
    meta = info.meta
    hparams = meta.get("hparams")
    labels = meta.get("labels")
    by_type: dict[str, list[str]] = {}
    for key in metrics:
        type_, _, name = key.partition("/")
        if type_ in (info.types or []):
            by_type.setdefault(type_, []).append(name)
    recorded = recorded_modes(meta)
    found: dict[str, query.MetricFacts] = {}
    damage = None
    for type_, names in by_type.items():
        try:
            series = _series(info.path, type_, names)
        except TrackingError as e:
            damage = str(e)
            continue
        for name, (last, lo, hi) in series.items():
            found[f"{type_}/{name}"] = query.metric_facts(f"{type_}/{name}", last, lo, hi, recorded)
    facts = query.RunFacts(
        name=str(meta.get("name", info.folder)),
        status=info.status,
        labels=tuple(x for x in labels if isinstance(x, str)) if isinstance(labels, list) else (),
        start_time=meta.get("start_time"),
        hparams=hparams if isinstance(hparams, dict) else {},
        metrics=found,
    )
    return facts, damage


def _series(run_path: Path, type_: str, names: list[str]) -> dict[str, tuple[Any, Any, Any]]:
    """Per metric name of a type: (value at the highest step, minimum, maximum), NaN left out of the
    extremes; the first point of a step logged twice."""
    steps: dict[str, array[int]] = {n: array("q") for n in names}
    out: dict[str, list[Any]] = {}
    for points, _ in metric_batches(run_path, type_):
        for point in points:
            step, values = point["step"], point["metrics"]
            for name, seen in steps.items():
                if name not in values:
                    continue
                if seen and step <= seen[-1]:
                    at = bisect.bisect_left(seen, step)
                    if at < len(seen) and seen[at] == step:
                        continue  # logged twice: the first point counts
                    seen.insert(at, step)
                else:
                    seen.append(step)
                value = values[name]
                s = out.setdefault(name, [None, None, None, -1])
                if step > s[3]:
                    s[0], s[3] = value, step
                if not (isinstance(value, float) and math.isnan(value)):
                    s[1] = value if s[1] is None else min(s[1], value)
                    s[2] = value if s[2] is None else max(s[2], value)
    return {name: (s[0], s[1], s[2]) for name, s in out.items()}
