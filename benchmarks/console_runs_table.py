"""The runs table with 10,000 runs: time of one page, sorted and filtered by an hparam and a metric.

Fills a fresh database with 10,000 runs of one user (8 hparams each; ``train/loss`` at 50 steps
and ``val/acc`` at 5 steps, 550,000 points, with their block summaries), then times, in process
(``TestClient``, so no network), the search endpoint ``GET /api/v1/search/runs`` and the console
page ``GET /ui/runs`` for each query below: the median of ``--repeat`` answers after one warm-up.

    .venv/bin/python benchmarks/console_runs_table.py
    .venv/bin/python benchmarks/console_runs_table.py --db postgresql+psycopg://ember@127.0.0.1:55432/bench

A PostgreSQL ``--db`` names a database that this script creates (and drops afterwards).
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import insert, select, text

from ember.server.app import create_app
from ember.server.services import admin
from ember.server.storage.models import Folder, MetricPoint, Run, User
from ember.server.storage.settings import Settings

QUERIES: dict[str, dict[str, Any]] = {
    "newest first": {},
    "name contains": {"q": "run-12"},
    "sort hp:lr": {"sort": "hp:lr"},
    "filter hp:lr<0.001": {"where": "hp:lr<0.001"},
    "sort -m:val/acc": {"sort": "-m:val/acc"},
    "filter m:val/acc>0.9": {"where": "m:val/acc>0.9"},
    "filter hp + sort metric": {"where": "hp:optimizer=adam", "sort": "m:train/loss"},
    "status Crashed": {"status": "Crashed"},
    "page 100, sort hp:lr": {"sort": "hp:lr", "page": 100},
    # The filter language (issue 33): compound filters, evaluated in SQL.
    "filter m:val/acc>0.9 and hp:lr<0.001": {"where": "m:val/acc>0.9 and hp:lr<0.001"},
    "filter hp:optimizer=adam and hp:lr>0.01 (none)": {"where": "hp:optimizer=adam and hp:lr>0.01 and hp:lr<0"},
    "filter (or, not, label, best, start)": {
        "where": "(m:val/acc.best > 0.95 or hp:model in (vit, cnn)) and not status = Crashed and label = group3 "
        "and start > 2026-01-02"
    },
    "filter status = Running, page 3": {"where": "status = Running", "page": 3},
}


@contextmanager
def database(url: str | None, tmp: Path) -> Iterator[str]:
    """A SQLite file in ``tmp``, or a PostgreSQL database created for the run and dropped after it."""
    if url is None:
        yield f"sqlite:///{tmp / 'bench.db'}"
        return
    import psycopg

    head, _, name = url.rpartition("/")
    admin_url = f"{head}/postgres".replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield url
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def fill(app: Any, runs: int, seed: int = 0) -> None:
    """``runs`` runs of alice in /alice/bench, with points and block summaries, straight into the tables."""
    rng = random.Random(seed)
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with app.state.sessions() as session, session.begin():
        alice = session.scalar(select(User).where(User.name == "alice"))
        assert alice is not None
        home = session.scalar(select(Folder).where(Folder.path == "/alice"))
        folder = Folder(path="/alice/bench", parent_id=home.id if home else None, owner_id=alice.id, created=start)
        session.add(folder)
        session.flush()
        rows = []
        for i in range(runs):
            begin = start + timedelta(minutes=i)
            status = rng.choices(["Complete", "Failed", "Running", "Interrupted"], [90, 4, 4, 2])[0]
            hparams = {
                "lr": 10 ** rng.uniform(-4, -1),
                "batch_size": rng.choice([16, 32, 64, 128]),
                "optimizer": rng.choice(["adam", "sgd"]),
                "epochs": rng.randint(1, 20),
                "dropout": rng.random() / 2,
                "seed": i,
                "model": rng.choice(["mlp", "cnn", "vit"]),
                "weight_decay": rng.choice([0.0, 1e-4, 1e-2]),
            }
            meta = {
                "status": status,
                "hostname": "bench-host",
                "pid": 1,
                # Half the Running runs stopped beating an hour ago: they list as Crashed.
                "heartbeat": (begin + timedelta(minutes=3)).isoformat()
                if i % 2
                else datetime.now(timezone.utc).isoformat(),
            }
            rows.append(
                {
                    "id": uuid.UUID(int=rng.getrandbits(128)).hex,
                    "folder_id": folder.id,
                    "owner_id": alice.id,
                    "name": f"run-{i}",
                    "status": status,
                    "start_time": begin.isoformat(),
                    "end_time": None if status == "Running" else (begin + timedelta(minutes=3)).isoformat(),
                    "labels": ["bench", f"group{i % 10}"],
                    "description": "",
                    "hparams": hparams,
                    "meta": meta,
                    "platform": {},
                    "uploaded": start,
                }
            )
        session.execute(insert(Run), rows)
        pks = list(session.scalars(select(Run.pk).order_by(Run.pk)))
        points = []
        for pk in pks:
            rate = rng.uniform(0.01, 0.1)
            points += [
                {
                    "run_pk": pk,
                    "type": "train",
                    "name": "loss",
                    "step": s,
                    "epoch": s / 10,
                    "time": 0.0,
                    "value": 2.0 / (1 + rate * s),
                }
                for s in range(50)
            ]
            top = rng.uniform(0.5, 0.99)
            points += [
                {
                    "run_pk": pk,
                    "type": "val",
                    "name": "acc",
                    "step": s,
                    "epoch": s / 10,
                    "time": 0.0,
                    "value": top * (s + 1) / 50,
                }
                for s in range(9, 50, 10)
            ]
            if len(points) >= 100_000:
                session.execute(insert(MetricPoint), points)
                points = []
        if points:
            session.execute(insert(MetricPoint), points)
        session.execute(
            text(
                "INSERT INTO metric_blocks (run_pk, type, name, block, first_step, last_step, min_epoch, max_epoch, "
                "min_value, max_value, count) SELECT run_pk, type, name, step / 128, min(step), max(step), "
                "min(epoch), max(epoch), min(value), max(value), count(*) FROM metric_points "
                "GROUP BY run_pk, type, name, step / 128"
            )
        )
    with app.state.engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("ANALYZE"))
            conn.commit()


def login(client: TestClient, key: str) -> None:
    """Sign the test client into the console through the login form."""
    page = client.get("/ui/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf, page.text[:300]
    r = client.post("/ui/login", data={"api_key": key, "csrf": csrf.group(1)}, follow_redirects=False)
    assert r.status_code == 303, r.text[:300]


def timed(call: Any, repeat: int) -> tuple[float, Any]:
    """Median seconds of ``repeat`` calls after one warm-up, and the last answer."""
    answer = call()
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        answer = call()
        times.append(time.perf_counter() - began)
    return statistics.median(times), answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", help="a PostgreSQL URL (its database is created and dropped); default SQLite")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ember-bench-") as tmp, database(args.db, Path(tmp)) as url:
        settings = Settings.make(data_dir=Path(tmp) / "data", db_url=url)
        key = admin.init(settings, "alice")
        app = create_app(settings)
        began = time.perf_counter()
        fill(app, args.runs)
        print(f"{url.split(':')[0]}: filled {args.runs} runs in {time.perf_counter() - began:.1f} s")
        with TestClient(app) as client:
            login(client, key)
            print("| query | API s | console page s | total runs matched |\n|---|---|---|---|")
            for label, params in QUERIES.items():
                api_s, answer = timed(
                    lambda p=params: client.get(
                        "/api/v1/search/runs", params=p, headers={"Authorization": f"Bearer {key}"}
                    ),
                    args.repeat,
                )
                assert answer.status_code == 200, answer.text[:300]
                page_s, page = timed(lambda p=params: client.get("/ui/runs", params=p), args.repeat)
                assert page.status_code == 200 and "runs-table" in page.text, page.text[:300]
                print(f"| {label} | {api_s:.3f} | {page_s:.3f} | {answer.json()['total']} |", flush=True)
        app.state.engine.dispose()


if __name__ == "__main__":
    main()
