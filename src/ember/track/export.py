"""``ember runs export``: a run's metrics as CSV, or everything about it as JSON, streamed.

Both formats are written a chunk of each metrics file at a time
(:func:`ember.track.store.metric_batches`), so memory stays bounded whatever the number of
points: CSV reads each file twice (the column names first, then the rows, both up to the same
byte so that a run still being written exports consistently), JSON once.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import IO, Any

from ember.track import lineage
from ember.track._fs import read_json
from ember.track._values import json_metrics
from ember.track.store import RUN_FILE, metric_batches, metric_types, read_platform


def write_csv(run_path: Path, out: IO[str]) -> None:
    """``type,step,epoch,time,<metric>...``: one row per point, types in :func:`metric_types` order."""
    types = metric_types(run_path)
    names: set[str] = set()
    ends: dict[str, int] = {}
    for type_ in types:
        ends[type_] = 0
        for batch, cursor in metric_batches(run_path, type_):
            for point in batch:
                names.update(point["metrics"])
            ends[type_] = cursor
    columns = sorted(names)
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["type", "step", "epoch", "time", *columns])
    for type_ in types:
        for batch, _ in metric_batches(run_path, type_, end=ends[type_]):
            writer.writerows(
                [type_, p["step"], "" if p["epoch"] is None else p["epoch"], p["time"],
                 *[p["metrics"].get(n, "") for n in columns]]
                for p in batch
            )  # fmt: skip


def _nested(value: Any, level: int) -> str:
    """``json.dumps(value, indent=2)`` as it appears ``level`` levels deep in an indented document."""
    return json.dumps(value, indent=2, allow_nan=False).replace("\n", "\n" + "  " * level)


_JSON_POINTS = 500


def write_json(run_path: Path, out: IO[str]) -> None:
    """``{"run", "platform", "metrics": {type: [points]}, "lineage"}``, exactly as ``json.dumps(..., indent=2)``
    lays it out, with NaN and infinities as the store's strings (strict JSON)."""
    platform = read_platform(run_path)
    out.write('{\n  "run": ' + _nested(read_json(run_path / RUN_FILE, follow_links=False), 1))
    out.write(',\n  "platform": ' + _nested(platform, 1) + ',\n  "metrics": {')
    types = metric_types(run_path)
    for i, type_ in enumerate(types):
        out.write(("," if i else "") + "\n    " + json.dumps(type_) + ": [")
        first = True
        for batch, _ in metric_batches(run_path, type_):
            if not batch:
                continue
            for point in batch:
                point["metrics"] = json_metrics(point["metrics"])
            for i in range(0, len(batch), _JSON_POINTS):  # json's indenting encoder holds a piece per value
                items = _nested(batch[i : i + _JSON_POINTS], 2)[1:-1].rstrip()  # the items, without brackets
                out.write(("" if first else ",") + items)
                first = False
        out.write("]" if first else "\n    ]")
    out.write(("\n  }" if types else "}") + ',\n  "lineage": ' + _nested(lineage.read_edges(run_path), 1))
    out.write("\n}\n")
