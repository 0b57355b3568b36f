"""Plain-text tables and metric summaries for the ``ember runs`` commands."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ember._format import format_time
from ember.track._fs import parse_iso
from ember.track._values import Point
from ember.track.store import metric_types, read_metrics


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "") -> str:
    """A left-aligned text table with a header row."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(indent + line for line in lines)


def kv(rows: Sequence[Sequence[Any]], indent: str = "") -> str:
    """Aligned 'key  value' lines."""
    width = max((len(str(k)) for k, _ in rows), default=0)
    return "\n".join(f"{indent}{str(k).ljust(width)}  {v}".rstrip() for k, v in rows)


def fmt_number(value: Any) -> str:
    """A metric value, short: 4 significant digits for floats."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.4g}"
    return str(value)


def fmt_time(iso: str | None) -> str:
    """An ISO time from run.json in this machine's time zone, to the second, with the zone (as
    the console writes times: ``2026-11-26 14:08:32 UTC+01:00``); '-' when missing."""
    seconds = parse_iso(iso)
    if seconds is None:
        return "-"
    return format_time(datetime.fromtimestamp(seconds).astimezone().isoformat(timespec="seconds"))


def shorten(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters with an ellipsis."""
    return text if len(text) <= width else text[: max(0, width - 3)] + "..."


def summarize(points: list[Point]) -> dict[str, dict[str, Any]]:
    """Per metric name: count, first/last step, last, min and max (NaN ignored for min/max)."""
    out: dict[str, dict[str, Any]] = {}
    for point in points:
        step = point["step"]
        for name, value in point["metrics"].items():
            s = out.get(name)
            if s is None:
                s = out[name] = {"count": 0, "first_step": step, "last_step": step, "last": value}
                s["min"] = s["max"] = None
            s["count"] += 1
            s["last_step"], s["last"] = step, value
            if not (isinstance(value, float) and math.isnan(value)):
                s["min"] = value if s["min"] is None else min(s["min"], value)
                s["max"] = value if s["max"] is None else max(s["max"], value)
    return out


def run_summaries(run_path: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """:func:`summarize` for every metric type of a run."""
    return {t: summarize(read_metrics(run_path, t)) for t in metric_types(run_path)}


def last_metrics_text(last: dict[str, Point], width: int = 60) -> str:
    """'train: loss=0.31 lr=0.001 | val: acc=0.97' cut to ``width``."""
    parts = []
    for type_, point in last.items():
        values = " ".join(f"{k}={fmt_number(v)}" for k, v in point["metrics"].items())
        parts.append(f"{type_}: {values}")
    return shorten(" | ".join(parts), width) or "-"
