"""The runs table's columns: which hparams and metrics a page shows, and each metric's last, best, min and max.

Shared by :mod:`ember.server.services.listing` (the runs table, the folder page) and the console's run
and compare pages. "Best" follows one rule, as ``ember runs compare`` does: the mode the runs
summarised together recorded in their ``run.json`` (``Run.meta``; the one most of them recorded,
:func:`ember.track.best.majority_mode`), else the metric's name
(:func:`ember.track.best.metric_mode`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ember.server.storage.models import MetricBlock, MetricPoint, Run
from ember.track.best import Mode, best_value, majority_mode, metric_mode, recorded_modes

DEFAULT_HPARAMS = 12
"""Hyper-parameters shown by default: those that vary across the page's runs, up to this many."""
DEFAULT_METRICS = 8


@dataclass
class RunPage:
    """One page of the runs table."""

    total: int
    page: int
    per_page: int
    runs: list[dict[str, Any]]
    hparam_keys: list[str]
    metric_keys: list[str]
    hparam_choices: list[str]
    metric_choices: list[str]
    metric_modes: dict[str, str]


def page_of(
    total: int,
    page: int,
    per_page: int,
    rows: list[dict[str, Any]],
    hp_asked: list[str],
    m_asked: list[str],
    modes: Mapping[str, Mode],
) -> RunPage:
    """A page with its columns: every flattened hparam and metric of its runs (the column chooser's
    choices), and those shown by default: the hparams that vary across the runs (all of them for
    a single run) and those sorted or filtered on; the first metrics, train before val and test.
    ``modes``: each metric's mode (:attr:`Summaries.modes`), named in its column's header."""
    hp_all = sorted({k for r in rows for k in r["hparams"]})
    varying = [k for k in hp_all if len({json.dumps(r["hparams"].get(k), sort_keys=True) for r in rows}) > 1]
    default = varying if len(rows) > 1 else hp_all
    hp_shown = sorted({*default[:DEFAULT_HPARAMS], *(k for k in hp_asked if k in hp_all)})
    m_all = sorted({k for r in rows for k in r["metrics"]}, key=metric_order)
    m_shown = sorted({*m_all[:DEFAULT_METRICS], *(k for k in m_asked if k in m_all)}, key=metric_order)
    shown_modes: dict[str, str] = {k: modes.get(k) or metric_mode(k) for k in m_all}
    return RunPage(total, page, per_page, rows, hp_shown, m_shown, hp_all, m_all, shown_modes)


@dataclass(frozen=True)
class Summaries:
    """What :func:`metric_summary` gives: per run, per ``type/name``, ``{"last", "best", "min",
    "max"}`` (``values``); and per ``type/name``, the mode ``best`` follows for all these runs
    (``modes``)."""

    values: dict[int, dict[str, dict[str, float | None]]]
    modes: dict[str, Mode]


def run_modes(session: Session, run_pks: list[int]) -> dict[int, dict[str, Mode]]:
    """Per run, the metric modes its ``run.json`` records (``Run.meta``; see :mod:`ember.track.best`)."""
    out: dict[int, dict[str, Mode]] = {pk: {} for pk in run_pks}
    for pk, meta in session.execute(select(Run.pk, Run.meta).where(Run.pk.in_(run_pks))):
        out[pk] = recorded_modes(meta)
    return out


def metric_summary(session: Session, run_pks: list[int]) -> Summaries:
    """Per run, per ``type/name``: the last value (at the highest step), the best one, the minimum
    and the maximum.

    "Best" follows one mode per metric for all these runs, the rule ``ember runs compare`` uses
    too: the mode most of them record, else the name rule
    (:func:`ember.track.best.majority_mode`), so a column of the runs table, whose header names
    the mode, holds comparable values. For one run, its own recorded mode.

    One query: the best from the block summaries (one row per 128 steps), the last value by one
    probe of the points' primary key per series, so a run of a million points costs as little
    as a short one. (A row-value ``IN`` list of keys would make SQLite scan every point.)
    """
    if not run_pks:
        return Summaries({}, {})
    block = MetricBlock.__table__.alias("b")
    last = (
        select(MetricPoint.value)
        .where(MetricPoint.run_pk == block.c.run_pk, MetricPoint.type == block.c.type, MetricPoint.name == block.c.name)
        .order_by(MetricPoint.step.desc())
        .limit(1)
        .scalar_subquery()
    )
    rows = session.execute(
        select(
            block.c.run_pk, block.c.type, block.c.name, func.min(block.c.min_value), func.max(block.c.max_value), last
        )
        .where(block.c.run_pk.in_(run_pks))
        .group_by(block.c.run_pk, block.c.type, block.c.name)
    ).all()
    recorded = run_modes(session, run_pks)
    modes: dict[str, Mode] = {}
    out: dict[int, dict[str, dict[str, float | None]]] = {pk: {} for pk in run_pks}
    for pk, type_, name, lo, hi, value in rows:
        key = f"{type_}/{name}"
        mode = modes.get(key)
        if mode is None:
            mode = modes[key] = majority_mode(key, (r.get(key) for r in recorded.values()))
        out[pk][key] = {"last": value, "best": best_value(key, lo, hi, mode), "min": lo, "max": hi}
    return Summaries(out, modes)


def metric_order(key: str) -> tuple[int, str]:
    """train first, then val, test and the other types; by name within a type."""
    return ({"train": 0, "val": 1, "test": 2}.get(key.split("/", 1)[0], 3), key)
