"""Chart data of a long run: the time of ``GET /runs/{id}/series`` for 3 metrics x 1,000,000 points.

Stores the points through the server's ingest (the same code as an upload, in-process, so the
set-up takes seconds, not minutes), then starts a fresh ``ember server`` process and times its
first answer (cold: nothing of the run in that process), the next ones (warm: the answer kept)
and the answer after 100 more points per metric (a live run's refresh), and checks that a
one-point spike survives the downsampling.

    .venv/bin/python benchmarks/server_series.py
    .venv/bin/python benchmarks/server_series.py --db postgresql+psycopg://ember@127.0.0.1:55432/bench
"""

from __future__ import annotations

import argparse
import math
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from ember.server.services import admin, ingest
from ember.server.storage.db import make_engine, session_factory
from ember.server.storage.models import Run
from ember.server.storage.schemas import MetricBatch
from ember.server.storage.settings import Settings

RUN = "e" * 32
NAMES = ("loss", "acc", "lr")
SPIKE = 777_777


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fill(settings: Settings, key: str, points: int, host: str) -> None:
    body = {"folder": "bench", "make_folder": True, "run": {"id": RUN, "name": "long", "status": "Complete"}}
    with httpx.Client(base_url=host, headers={"Authorization": f"Bearer {key}"}) as http:
        http.put(f"/api/v1/runs/{RUN}", json=body).raise_for_status()
    engine = make_engine(settings.db_url)
    sessions = session_factory(engine)
    batch = 100_000
    with sessions() as session:
        run_pk = session.scalar(select(Run.pk).where(Run.id == RUN))
    for i, lo in enumerate(range(0, points, batch)):
        steps = list(range(lo, min(points, lo + batch)))
        metrics = {name: [math.sin(s / 5000 + k) for s in steps] for k, name in enumerate(NAMES)}
        if lo <= SPIKE < lo + batch:
            metrics["loss"][SPIKE - lo] = 1000.0
        with sessions() as session, session.begin():
            _store(session, run_pk, i, steps, metrics)
    engine.dispose()


def _append(settings: Settings, points: int, more: int) -> None:
    """``more`` points per metric after the first ``points``, as a live run's next upload."""
    engine = make_engine(settings.db_url)
    sessions = session_factory(engine)
    with sessions() as session, session.begin():
        run_pk = session.scalar(select(Run.pk).where(Run.id == RUN))
        cursor = ingest.cursors(session, "run", RUN)["metrics/train.jsonl"]
        _store(session, run_pk, cursor, list(range(points, points + more)), {name: [0.5] * more for name in NAMES})
    engine.dispose()


def _store(session: Any, run_pk: int, cursor: int, steps: list[int], metrics: dict[str, list[float]]) -> None:
    """One upload of the run's train metrics at ``steps``, from the stream's ``cursor``."""
    columns = MetricBatch(
        type="train",
        start=cursor,
        end=cursor + 1,
        step=steps,
        epoch=[s / 1000 for s in steps],
        time=[0.0] * len(steps),
        metrics=metrics,
    )
    ingest.store_metrics(session, run_pk, RUN, columns, max_points=len(NAMES) * len(steps))


def _serve(settings: Settings, port: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "ember.server.cli", "server", "--db", settings.db_url]
    argv += ["--data", str(settings.data_dir), "--port", str(port), "--log-level", "warning"]
    server = subprocess.Popen(argv)
    for _ in range(300):
        try:
            httpx.get(f"http://127.0.0.1:{port}/api/v1/openapi.json", timeout=1)
            return server
        except httpx.HTTPError:
            time.sleep(0.1)
    server.terminate()
    raise RuntimeError("the server did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=1_000_000, help="points per metric (3 metrics)")
    parser.add_argument("--db", help="database URL (default: SQLite in a temp folder)")
    parser.add_argument("--repeat", type=int, default=5, help="warm requests to time")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ember-series-"))
    settings = Settings.make(data_dir=root / "data", db_url=args.db or f"sqlite:///{root / 'server.db'}")
    key = admin.init(settings, "bench")
    port = _port()
    host = f"http://127.0.0.1:{port}"
    server = _serve(settings, port)
    try:
        began = time.perf_counter()
        _fill(settings, key, args.points, host)
        print(f"stored {len(NAMES)} x {args.points:,} points in {time.perf_counter() - began:.1f} s")
    finally:
        server.terminate()
        server.wait(10)
    server = _serve(settings, port)  # a fresh process: nothing of the run in memory
    try:
        with httpx.Client(base_url=host, headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
            times = []
            for _ in range(1 + args.repeat):
                began = time.perf_counter()
                r = http.get(f"/api/v1/runs/{RUN}/series", params={"type": "train"})
                times.append(time.perf_counter() - began)
                r.raise_for_status()
            _append(settings, args.points, 100)
            began = time.perf_counter()
            http.get(f"/api/v1/runs/{RUN}/series", params={"type": "train"}).raise_for_status()
            grown = time.perf_counter() - began
        metrics = r.json()["metrics"]
        spike = args.points > SPIKE and max(v for v in metrics["loss"]["value"] if v is not None) == 1000.0
        counts = [metrics[n]["count"] for n in NAMES]
        print(f"cold (first request of a fresh server process): {times[0]:.3f} s")
        print(f"warm (median of {args.repeat}): {statistics.median(times[1:]):.3f} s")
        print(f"after 100 more points per metric (a live run's refresh): {grown:.3f} s")
        print(f"points per metric {counts}, chart points {[len(metrics[n]['value']) for n in NAMES]}")
        print(f"spike kept: {'yes' if spike else 'NO'}")
        return 0 if counts == [args.points] * len(NAMES) and (spike or args.points <= SPIKE) else 1
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    sys.exit(main())
