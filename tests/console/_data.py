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
