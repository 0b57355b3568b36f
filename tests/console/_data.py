"""Runs for the console tests: two tiny trained runs with an output artifact, uploaded as a user."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import text

from ember import track
from ember.track.client import Client, Credentials, upload_run
from tests.server._runs import train_tiny


def make_store(store: Path, lrs: tuple[float, ...] = (0.1, 0.05)) -> list[track.Run]:
    """Runs 'tiny-0', 'tiny-1'... with 30 train steps (3 val points) and a linked 'tiny-model' artifact."""
    runs = []
    for i, lr in enumerate(lrs):
        run, _ = train_tiny(store, steps=30, name=f"tiny-{i}", folder="examples")
        run.hparams["lr"] = lr
        run.labels = ["tiny", f"lr{lr}"]
        run.finish()
        runs.append(run)
    return runs


def upload(runs: list[track.Run], host: str, key: str, folder: str | None = None) -> None:
    """Upload runs (and their artifacts) as the key's user."""
    with Client(Credentials(host, key)) as client:
        for run in runs:
            upload_run(run.path, folder, True, "new", client)


def write_runs(store: Path, count: int, folder: str = "default", points: int = 3, first: int = 0) -> list[Path]:
    """``count`` finished runs written straight in the store's layout (fast): ``r00000``, ``r00001``...

    Run ``i`` was created ``i`` seconds after the first (its folder name says so), so the last
    one is the newest.
    """
    import json
    import uuid
    from datetime import datetime, timedelta, timezone

    base = datetime(2026, 1, 1, tzinfo=timezone.utc)
    paths = []
    for i in range(first, first + count):
        when = base + timedelta(seconds=i)
        path = store / "runs" / f"r{i:05d}_{when:%y%m%d_%H%M%S}_{i:06d}"
        (path / "metrics").mkdir(parents=True)
        meta = {
            "format": "ember.run/1", "id": uuid.uuid4().hex, "name": f"r{i:05d}", "folder": folder, "labels": [],
            "description": "", "status": "Complete", "start_time": when.isoformat(), "end_time": when.isoformat(),
            "heartbeat": when.isoformat(), "pid": 1, "hostname": "elsewhere", "hparams": {"i": i}, "resumes": [],
            "reason": None,
        }  # fmt: skip
        (path / "run.json").write_text(json.dumps(meta))
        (path / "platform.json").write_text("{}")
        (path / "stdout.log").write_text(f"run {i}\n")
        lines = [
            json.dumps({"step": s, "epoch": 0, "time": 1.7e9 + s, "metrics": {"loss": 1 / (s + 1)}})
            for s in range(points)
        ]
        (path / "metrics" / "train.jsonl").write_text("".join(line + "\n" for line in lines))
        paths.append(path)
    return paths


def stored_rows(app: Any) -> dict[str, list[tuple[Any, ...]]]:
    """Every row a run or artifact upload writes, keyed by ids instead of primary keys."""
    queries = {
        "runs": "SELECT r.id, r.name, r.status, r.start_time, r.end_time, r.labels, r.description, r.hparams, r.meta, "
        "r.platform, f.path, u.name FROM runs r JOIN folders f ON f.id = r.folder_id JOIN users u ON u.id = r.owner_id",
        "points": "SELECT r.id, p.type, p.name, p.step, p.epoch, p.time, p.value FROM metric_points p "
        "JOIN runs r ON r.pk = p.run_pk",
        "blocks": "SELECT r.id, b.type, b.name, b.block, b.first_step, b.last_step, b.min_epoch, b.max_epoch, "
        "b.min_value, b.max_value, b.count FROM metric_blocks b JOIN runs r ON r.pk = b.run_pk",
        "cursors": 'SELECT node_kind, node_id, stream, "offset" FROM cursors',
        "log": 'SELECT r.id, r.log_bytes, c.start, c."end", c.line, c.newlines, c.text FROM log_pieces c '
        "JOIN runs r ON r.pk = c.run_pk",
        "lineage": "SELECT source_kind, source_id, source_name, target_kind, target_id, target_name, time FROM lineage",
        "artifacts": 'SELECT a.id, a.name, f.path, a.labels, a.created, a."references", x.path, x.size, x.sha256 '
        "FROM artifacts a JOIN folders f ON f.id = a.folder_id JOIN artifact_files x ON x.artifact_pk = a.pk",
        "folders": "SELECT path FROM folders",
        "images": "SELECT r.id, i.name, i.step, i.time, i.width, i.height, i.size, i.png FROM run_images i "
        "JOIN runs r ON r.pk = i.run_pk",
    }
    with app.state.engine.connect() as conn:
        tables = {name: [list(row) for row in conn.execute(text(sql))] for name, sql in queries.items()}
    for row in tables["runs"]:  # the live run's heartbeat moves on between the two reads
        row[8] = {k: v for k, v in json.loads(row[8]).items() if k != "heartbeat"}
    return {name: sorted(tuple(map(repr, row)) for row in rows) for name, rows in tables.items()}


CHAIN = [f"d{i}" * 16 for i in range(1, 6)]
"""The runs 'step-1' to 'step-5' of :func:`lineage_graph`, in order."""
BRANCH = "db" * 16


def lineage_graph(send: Any, folder: str = "lineage") -> dict[str, str]:
    """Runs 'step-1' -> ... -> 'step-5' (a chain), 'step-3' -> 'branch', and 'step-5' -> 'step-3' (a cycle).

    ``send(method, path, json)`` is an authorised API request answering its status code.
    Returns each run's id by name.
    """
    ids = {f"step-{i + 1}": run_id for i, run_id in enumerate(CHAIN)} | {"branch": BRANCH}
    for name, run_id in ids.items():
        run = {"id": run_id, "name": name, "status": "Complete"}
        assert send("PUT", f"/runs/{run_id}", {"folder": folder, "make_folder": True, "run": run}) == 200
    pairs = [(CHAIN[i], CHAIN[i + 1]) for i in range(4)] + [(CHAIN[2], BRANCH), (CHAIN[4], CHAIN[2])]
    lines: dict[str, list[dict[str, Any]]] = {}
    for t, (source, target) in enumerate(pairs):
        edge = {"time": 1.0 + t, "source": {"kind": "run", "id": source, "name": "s"}}
        lines.setdefault(source, []).append(edge | {"target": {"kind": "run", "id": target, "name": "t"}})
    for run_id, edges in lines.items():
        body = {"start": 0, "end": len(edges), "edges": edges}
        assert send("POST", f"/runs/{run_id}/lineage", body) == 200
    return ids
