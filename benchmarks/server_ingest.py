"""Ingest throughput of the tracking server: N clients each upload a run of P points at once.

Starts ``ember server`` (SQLite in a temp folder, or PostgreSQL with --db), writes N local runs
of P points each (one metric per line, as ``run.log`` writes them), uploads them concurrently
with ``ember.track.client.upload_run`` from N threads, and reports points/s ingested and
whether every point is stored exactly once.

    .venv/bin/python benchmarks/server_ingest.py                      # 8 x 50,000 on SQLite
    .venv/bin/python benchmarks/server_ingest.py --db postgresql+psycopg://ember@127.0.0.1:55432/bench
    .venv/bin/python benchmarks/server_ingest.py --clients 2 --points 2000   # a smoke run
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from ember import track
from ember.server import admin
from ember.server.settings import Settings
from ember.track.client import Client, Credentials, upload_run


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--points", type=int, default=50_000)
    parser.add_argument("--db", help="database URL (default: SQLite in a temp folder)")
    parser.add_argument("--workers", type=int, default=1, help="server processes")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ember-bench-"))
    url = args.db or f"sqlite:///{root / 'server.db'}"
    settings = Settings.make(data_dir=root / "data", db_url=url)
    key = admin.init(settings, "bench")
    runs = []
    for i in range(args.clients):
        run = track.create_run(name=f"bench{i}", home=root / "store")
        for step in range(args.points):
            run.log("train", {"loss": 1.0 / (step + 1)}, step=step)
        run.finish()
        runs.append(run)
    port = _port()
    argv = [sys.executable, "-m", "ember.server.cli", "server", "--db", url, "--data", str(settings.data_dir)]
    argv += ["--port", str(port), "--workers", str(args.workers), "--log-level", "warning"]
    server = subprocess.Popen(argv)
    host = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                httpx.get(f"{host}/api/v1/openapi.json", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        creds = Credentials(host, key)
        errors: list[BaseException] = []

        def upload(run: track.Run) -> None:
            try:
                with Client(creds) as client:
                    upload_run(run.path, client=client, artifacts=False)
            except Exception as e:  # noqa: BLE001 - reported below, the benchmark fails
                errors.append(e)

        threads = [threading.Thread(target=upload, args=(r,)) for r in runs]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
        if errors:
            print(f"FAILED: {errors[0]}")
            return 1
        total = args.clients * args.points
        with Client(creds) as client:
            stored = [sum(m["count"] for m in client.call("GET", f"/runs/{r.id}")["metrics"]) for r in runs]
            again = time.perf_counter()
            upload_run(runs[0].path, client=client, artifacts=False)
            stored_again = sum(m["count"] for m in client.call("GET", f"/runs/{runs[0].id}")["metrics"])
            repeat = time.perf_counter() - again
        exact = all(n == args.points for n in stored) and stored_again == args.points
        db = url.split(":")[0]
        rate = total / elapsed
        print(f"{db}: {args.clients} clients x {args.points} points = {total} in {elapsed:.2f} s: {rate:,.0f} points/s")
        print(f"exactly once: {'yes' if exact else 'NO'} (points per run: {sorted(set(stored))})")
        print(f"re-upload of one run: {repeat:.2f} s, added {stored_again - args.points} points")
        return 0 if exact else 1
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    sys.exit(main())
