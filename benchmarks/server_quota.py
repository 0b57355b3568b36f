"""What a metrics POST costs under a quota, by how many artifact files its owner holds.

For each size N (10, 1,000, 10,000 by default), a fresh server (in process, ``fastapi``'s test
client, no network) with ``--quota-mb`` set; the owner's store gets N artifact files (N distinct
blobs, 10 files an artifact, written straight into the database: the benchmark is not about
uploading them) and one run; then ``--posts`` metrics batches of ``--lines`` lines are sent to
the run one after the other, each timed. Reported per N: the median and p90 milliseconds of a
POST, after ``--warmup`` batches (the first check of an owner sums their store once). Before the
owner's bound (``users.stored_bytes``), every batch summed the owner's whole store.

    .venv/bin/python benchmarks/server_quota.py
    .venv/bin/python benchmarks/server_quota.py --db postgresql+psycopg://ember@127.0.0.1:55432/postgres
    PYTHONPATH=/path/to/other/checkout/src .venv/bin/python benchmarks/server_quota.py   # the same on other code
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from sqlalchemy import text

warnings.filterwarnings("ignore", message=".*httpx2.*")

from fastapi.testclient import TestClient  # noqa: E402

from ember.server.app import create_app  # noqa: E402
from ember.server.services import admin  # noqa: E402
from ember.server.storage.settings import Settings  # noqa: E402

RUN = "ab" * 16
FILES_PER_ARTIFACT = 10


def _database(base: str | None, folder: Path) -> tuple[str, Any]:
    """A fresh database URL and how to drop it (SQLite: a file in ``folder``)."""
    if base is None:
        return f"sqlite:///{folder / 'server.db'}", lambda: None
    import psycopg

    name = f"ember_bench_{secrets.token_hex(4)}"
    admin_url = base.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")

    def drop() -> None:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    return f"{base.rpartition('/')[0]}/{name}", drop


def _fill(engine: Any, files: int) -> None:
    """Give alice ``files`` artifact files (distinct 1 KiB blobs), 10 to an artifact, in her home."""
    with engine.begin() as conn:
        owner, folder = conn.execute(
            text("SELECT u.id, f.id FROM users u JOIN folders f ON f.path = '/' || u.name WHERE u.name = 'alice'")
        ).one()
        stamp = "2026-01-01 00:00:00"
        shas = [hashlib.sha256(f"blob {i}".encode()).hexdigest() for i in range(files)]
        conn.execute(
            text("INSERT INTO blobs (sha256, size, created) VALUES (:sha, 1024, :t)"),
            [{"sha": sha, "t": stamp} for sha in shas],
        )
        for a in range(0, files, FILES_PER_ARTIFACT):
            artifact_id = hashlib.md5(f"artifact {a}".encode()).hexdigest()
            pk = conn.execute(
                text(
                    "INSERT INTO artifacts (id, folder_id, owner_id, name, labels, description, created, "
                    "\"references\", uploaded) VALUES (:id, :folder, :owner, :name, '[]', '', NULL, '[]', :t) "
                    "RETURNING pk"
                ),
                {"id": artifact_id, "folder": folder, "owner": owner, "name": f"a{a}", "t": stamp},
            ).scalar_one()
            conn.execute(
                text("INSERT INTO artifact_files (artifact_pk, path, size, sha256) VALUES (:pk, :path, 1024, :sha)"),
                [{"pk": pk, "path": f"f{i}.bin", "sha": sha} for i, sha in enumerate(shas[a : a + FILES_PER_ARTIFACT])],
            )


def _batch(index: int, lines: int) -> dict[str, Any]:
    steps = list(range(index * lines, (index + 1) * lines))
    return {
        "type": "train",
        "start": index * 100,
        "end": (index + 1) * 100,
        "step": steps,
        "epoch": [None] * lines,
        "time": [1.0] * lines,
        "metrics": {"loss": [0.5] * lines},
    }


def measure(files: int, db: str | None, posts: int, warmup: int, lines: int) -> list[float]:
    """Seconds of each timed metrics POST against an owner holding ``files`` artifact files."""
    with tempfile.TemporaryDirectory() as tmp:
        url, drop = _database(db, Path(tmp))
        try:
            settings = Settings.make(data_dir=Path(tmp) / "data", db_url=url, quota_bytes=1 << 40)
            key = admin.init(settings, "alice")
            app = create_app(settings)
            headers = {"Authorization": f"Bearer {key}"}
            with TestClient(app) as client:
                _fill(app.state.engine, files)
                run = {"run": {"id": RUN, "name": "r", "status": "Running"}, "folder": "default", "make_folder": True}
                assert client.put(f"/api/v1/runs/{RUN}", json=run, headers=headers).status_code == 200
                times = []
                for i in range(warmup + posts):
                    began = time.perf_counter()
                    answer = client.post(f"/api/v1/runs/{RUN}/metrics", json=_batch(i, lines), headers=headers)
                    took = time.perf_counter() - began
                    assert answer.status_code == 200, answer.text
                    if i >= warmup:
                        times.append(took)
            app.state.engine.dispose()
            return times
        finally:
            drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=None, help="a PostgreSQL URL to make the databases on (default: SQLite)")
    parser.add_argument("--sizes", default="10,1000,10000", help="artifact files the owner holds, comma-separated")
    parser.add_argument("--posts", type=int, default=60, help="timed metrics POSTs per size")
    parser.add_argument("--warmup", type=int, default=5, help="POSTs sent first, not timed")
    parser.add_argument("--lines", type=int, default=100, help="lines (points) per batch")
    args = parser.parse_args()
    where = "PostgreSQL" if args.db else "SQLite"
    print(f"{where}, code from {os.path.dirname(os.path.dirname(__import__('ember').__file__))}")
    print(f"{'files':>8} {'median ms':>10} {'p90 ms':>8}")
    for size in (int(s) for s in args.sizes.split(",")):
        times = sorted(measure(size, args.db, args.posts, args.warmup, args.lines))
        p90 = times[int(0.9 * (len(times) - 1))]
        print(f"{size:>8} {statistics.median(times) * 1e3:>10.2f} {p90 * 1e3:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
