"""Ingest throughput of the tracking server, then latency under a mixed load with blob uploads.

Starts ``ember server`` (SQLite in a temp folder, or PostgreSQL with --db).

1. Ingest: writes N local runs of P points each (one metric per line, as ``run.log`` writes
   them), uploads them concurrently with ``ember.track.client.upload_run`` from N threads, and
   reports points/s ingested and whether every point is stored exactly once.
2. Mixed load (issue 17): N client *processes* for S seconds, each in a loop: log a batch of
   metrics to its run, upload a 64 KiB blob and an artifact listing it, read its run's chart
   series. Every request is timed; reported: requests, failed requests (an error or an HTTP
   status >= 400), and p50/p99/max latency per kind and overall. The target is 0 failed and
   p99 < 1 s (a blob upload used to freeze the whole server on SQLite).

    .venv/bin/python benchmarks/server_ingest.py                      # 8 x 50,000 on SQLite, then 30 s of load
    .venv/bin/python benchmarks/server_ingest.py --db postgresql+psycopg://ember@127.0.0.1:55432/bench
    .venv/bin/python benchmarks/server_ingest.py --points 0 --load-seconds 30      # the mixed load only
    .venv/bin/python benchmarks/server_ingest.py --clients 2 --points 2000 --load-seconds 3   # a smoke run
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

from ember import track
from ember.server.services import admin
from ember.server.storage.settings import Settings
from ember.track.client import Client, Credentials, upload_run


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


BLOB_BYTES = 64 << 10
LINES = 100  # metric lines per batch in the mixed load


def _client_loop(host: str, key: str, index: int, seconds: float, start_at: float) -> list[tuple[str, float, bool]]:
    """One client process of the mixed load: (request kind, seconds, ok) for every request it made."""
    run_id = uuid.uuid4().hex
    done: list[tuple[str, float, bool]] = []
    with httpx.Client(base_url=f"{host}/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:

        def timed(kind: str, method: str, path: str, **kwargs: object) -> None:
            began = time.perf_counter()
            try:
                ok = http.request(method, path, **kwargs).status_code < 400  # type: ignore[arg-type]
            except httpx.HTTPError:
                ok = False
            done.append((kind, time.perf_counter() - began, ok))

        run = {"id": run_id, "name": f"load{index}", "status": "Running"}
        timed("put run", "PUT", f"/runs/{run_id}", json={"folder": "load", "make_folder": True, "run": run})
        time.sleep(max(0.0, start_at - time.time()))
        deadline = time.monotonic() + seconds
        cursor, step = 0, 0
        while time.monotonic() < deadline:
            steps = list(range(step, step + LINES))
            batch = {
                "type": "train",
                "start": cursor,
                "end": cursor + LINES * 50,
                "step": steps,
                "epoch": [s // 1000 for s in steps],
                "time": [time.time()] * LINES,
                "metrics": {"loss": [1.0 / (s + 1) for s in steps], "acc": [s / 1e6 for s in steps]},
            }
            timed("metrics", "POST", f"/runs/{run_id}/metrics", json=batch)
            cursor, step = cursor + LINES * 50, step + LINES
            data = os.urandom(BLOB_BYTES)
            sha = hashlib.sha256(data).hexdigest()
            timed("blob", "PUT", f"/blobs/{sha}", content=data)
            art_id = uuid.uuid4().hex
            files = [{"path": "weights.bin", "size": len(data), "sha256": sha}]
            body = {"folder": "load", "artifact": {"id": art_id, "name": f"a{index}-{step}", "files": files}}
            timed("artifact", "PUT", f"/artifacts/{art_id}", json=body)
            timed("series", "GET", f"/runs/{run_id}/series", params={"type": "train"})
    return done


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def mixed_load(host: str, key: str, clients: int, seconds: float) -> bool:
    """Run the mixed load; print the figures; whether it met 0 failed and p99 < 1 s."""
    before = _load_average()
    context = multiprocessing.get_context("spawn")
    start_at = time.time() + 3  # every process has started and created its run by then
    with context.Pool(clients) as pool:
        results = pool.starmap(_client_loop, [(host, key, i, seconds, start_at) for i in range(clients)])
    after = _load_average()
    records = [r for client in results for r in client if r[0] != "put run"]
    failed = sum(1 for _, _, ok in records if not ok)
    print(f"mixed load: {clients} client processes x {seconds:.0f} s (load average before: {before}; after: {after})")
    print(f"{'request':10} {'count':>6} {'failed':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    kinds = [*dict.fromkeys(kind for kind, _, _ in records), "all"]
    p99_all = 0.0
    for kind in kinds:
        times = [t for k, t, _ in records if k == kind or kind == "all"]
        bad = sum(1 for k, _, ok in records if (k == kind or kind == "all") and not ok)
        p50, p99, top = (_quantile(times, q) * 1000 for q in (0.5, 0.99, 1.0))
        if kind == "all":
            p99_all = p99 / 1000
        print(f"{kind:10} {len(times):>6} {bad:>6} {p50:>8.0f} {p99:>8.0f} {top:>8.0f}")
    rate = len(records) / seconds
    met = failed == 0 and p99_all < 1.0
    print(f"{rate:.0f} requests/s; target (0 failed, p99 < 1 s): {'met' if met else 'MISSED'}")
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--points", type=int, default=50_000, help="points per client to ingest (0: skip)")
    parser.add_argument("--load-seconds", type=float, default=30.0, help="seconds of mixed load (0: skip)")
    parser.add_argument("--db", help="database URL (default: SQLite in a temp folder)")
    parser.add_argument("--workers", type=int, default=1, help="server processes")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ember-bench-"))
    url = args.db or f"sqlite:///{root / 'server.db'}"
    settings = Settings.make(data_dir=root / "data", db_url=url)
    key = admin.init(settings, "bench")
    runs = []
    for i in range(args.clients if args.points else 0):
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
        ok = True
        if args.points:
            ok = ingest(args, runs, host, key, url)
        if args.load_seconds:
            ok = mixed_load(host, key, args.clients, args.load_seconds) and ok
        return 0 if ok else 1
    finally:
        server.terminate()
        server.wait(10)


def ingest(args: argparse.Namespace, runs: list[track.Run], host: str, key: str, url: str) -> bool:
    """Upload the runs from one thread each; print points/s; whether every point is stored once."""
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
        return False
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
    return exact


if __name__ == "__main__":
    sys.exit(main())
