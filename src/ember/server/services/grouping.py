"""Runs grouped by the values of some hyper-parameters: the runs table's "group by" (issue 33, item 6).

One group per combination of the values of the keys (``optimizer,lr``: one group for each
optimizer and learning rate met), in the order the table's sort meets them first; a run without
a key is in the group of ``None`` for it. Each group holds its runs and, per metric column, the
mean and the standard deviation (the population's: 0 for one run) of its runs' last and best
values, over the runs that have a finite one (``n``). The compare page folds its charts the same
way in the browser (``compare.js``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from ember.server.storage.domain_errors import Invalid

MAX_KEYS = 4
"""The most keys a table is grouped by."""
MAX_RUNS = 500
"""The most runs a grouped table reads: the first this many in its order (the table's largest page)."""


@dataclass
class Group:
    """One combination of the keys' values and its runs.

    Attributes:
        values: the keys' values, in the keys' order (``None`` for a run without the key).
        label: ``key=value`` for each key, joined by ``" · "``.
        runs: the runs' rows, in the table's order.
        metrics: per metric, ``{"n", "last_mean", "last_std", "best_mean", "best_std"}``; a metric none
            of the runs has a finite value of is absent.
        hparams: per hparam of its runs, ``(value, 1)`` when they share it, else ``(None, count of
            distinct values)``.
    """

    values: list[Any]
    label: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    hparams: dict[str, tuple[Any, int]] = field(default_factory=dict)


def parse_keys(text: str, known: list[str]) -> list[str]:
    """The keys of ``?group=a,b``: each once, in the order given.

    Args:
        text: comma-separated flattened hparam names (``opt.name,lr``); empty for none.
        known: the hparams the runs have.

    Raises:
        Invalid: more than :data:`MAX_KEYS` keys, or one no run has (422 on the API; said beside
            the field on the page), naming the key and the hparams there are.

    Example:
        >>> parse_keys(" opt.name, lr,lr", ["lr", "opt.name"])
        ['opt.name', 'lr']
    """
    keys = list(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    if len(keys) > MAX_KEYS:
        raise Invalid.field("group", f"group by at most {MAX_KEYS} hyper-parameters, not {len(keys)}")
    for key in keys:
        if key not in known:
            there = ", ".join(known[:20]) + (" ..." if len(known) > 20 else "") if known else "none"
            raise Invalid.field("group", f"no run here has the hyper-parameter {key[:80]!r} (here: {there})")
    return keys


def group_runs(rows: list[dict[str, Any]], keys: list[str], metrics: list[str]) -> list[Group]:
    """The runs table's rows (with flattened ``hparams`` and ``metrics`` summaries) grouped by ``keys``.

    Example:
        >>> [(g.label, len(g.runs)) for g in group_runs(rows, ["opt"], ["val/acc"])]
        [('opt=adam', 3), ('opt=sgd', 3)]
    """
    groups: dict[str, Group] = {}
    for row in rows:
        values = [row["hparams"].get(k) for k in keys]
        key = json.dumps(values, sort_keys=True, default=str)
        if key not in groups:
            label = " · ".join(f"{k}={'—' if v is None else _text(v)}" for k, v in zip(keys, values, strict=True))
            groups[key] = Group(values, label)
        groups[key].runs.append(row)
    for group in groups.values():
        for k in sorted({k for r in group.runs for k in r["hparams"]}):
            distinct = {json.dumps(r["hparams"].get(k), sort_keys=True, default=str) for r in group.runs}
            group.hparams[k] = (group.runs[0]["hparams"].get(k), 1) if len(distinct) == 1 else (None, len(distinct))
        for metric in metrics:
            summaries = [r["metrics"].get(metric) or {} for r in group.runs]
            last = _finite(s.get("last") for s in summaries)
            best = _finite(s.get("best") for s in summaries)
            if last or best:
                group.metrics[metric] = {"n": len(last), **_stats("last", last), **_stats("best", best)}
    return list(groups.values())


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _finite(values: Any) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]


def _stats(name: str, values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    mean = math.fsum(values) / len(values)
    return {f"{name}_mean": mean, f"{name}_std": math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))}
