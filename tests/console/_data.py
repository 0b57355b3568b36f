"""Runs for the console tests: two tiny trained runs with an output artifact, uploaded as a user."""

from __future__ import annotations

from pathlib import Path

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
