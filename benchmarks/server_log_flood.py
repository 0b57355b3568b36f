"""Issue 30, item 1's attack on a loopback ``ember server``: another user's latency and the server's memory.

An attacker posts ``--attack-mb`` of newlines to her own run's output in ``--chunk-mb`` requests
(60 MB took 3 s in the red-team report), then ``--extra`` more requests (refused once the run's
output reaches ``--max-log-mb``), while ``--browsers`` console sessions are on her run page:
each loads it, then asks its live refresh (``/ui/runs/{id}/live``) every ``--poll-s`` seconds, as
the page's script does (5 s), and loads the page again every ``--reload-s``. Meanwhile another
user, in a process of their own, asks ``GET /api/v1/me`` every 10 ms. The same user's latency is
measured for ``--baseline-s`` seconds before the attack. The server's resident memory
(``VmRSS``) is sampled every 0.2 s. Bounded: the attack phase stops after ``--seconds``
whatever is left; everything runs on 127.0.0.1.

The server runs from this checkout, or from ``--server-src`` (another checkout's ``src``, e.g.
main before issue 30), whose own CLI also creates the users, so the database has its schema.

    .venv/bin/python benchmarks/server_log_flood.py
    .venv/bin/python benchmarks/server_log_flood.py --server-src /tmp/main/src --chunk-mb 4   # before the fix
    .venv/bin/python benchmarks/server_log_flood.py --db postgresql+psycopg://ember@127.0.0.1:55432/bench
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

RUN = "f1" * 16
MiB = 1 << 20


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _rss_mib(pid: int) -> float:
    """The resident memory of a process and its children (uvicorn's workers), in MiB."""
    total = 0.0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    for p in pids:
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except FileNotFoundError:
            continue
        found = re.search(r"VmRSS:\s+(\d+) kB", status)
        total += int(found.group(1)) / 1024 if found else 0.0
    return total


def _victim(host: str, key: str, seconds: float, out: Any) -> None:
    """Another user's requests, in a process of its own: one ``GET /me`` every 10 ms; (wall time sent, seconds)."""
    times: list[tuple[float, float]] = []
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=host, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        while time.monotonic() < deadline:
            sent, began = time.time(), time.perf_counter()
            http.get("/api/v1/me").raise_for_status()
            times.append((sent, time.perf_counter() - began))
            time.sleep(0.01)
    out.put(times)


def _measure_victim(host: str, key: str, seconds: float) -> multiprocessing.Process:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    proc = context.Process(target=_victim, args=(host, key, seconds, queue))
    proc.start()
    proc.queue = queue  # type: ignore[attr-defined]
    return proc


def _cli(src: Path | None, *args: str) -> str:
    """``ember server ...`` from the server's checkout; its last output line (a key)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    done = subprocess.run(
        [sys.executable, "-m", "ember.server.cli", "server", *args], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip().splitlines()[-1]


def _browser(
    host: str, key: str, poll_s: float, reload_s: float, stop: threading.Event, times: list[float], failures: list[str]
) -> None:
    """A console session on the attacker's run page: the page, its live refresh every ``poll_s``, the page
    again every ``reload_s``."""
    with httpx.Client(base_url=host, timeout=120) as http:
        page = http.get("/ui/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf, page.text[:200]
        http.post("/ui/login", data={"api_key": key, "csrf": csrf.group(1)})
        due = {f"/ui/runs/{RUN}": 0.0, f"/ui/runs/{RUN}/live": 0.0}
        every = {f"/ui/runs/{RUN}": reload_s, f"/ui/runs/{RUN}/live": poll_s}
        while not stop.is_set():
            path = min(due, key=lambda p: due[p])
            stop.wait(max(0.0, due[path] - time.monotonic()))
            if stop.is_set():
                return
            began = time.perf_counter()
            answer = http.get(path)
            times.append(time.perf_counter() - began)
            due[path] = time.monotonic() + every[path]
            if answer.status_code != 200:
                failures.append(f"{path} -> {answer.status_code}")


def _attack(host: str, key: str, total_mb: float, chunk_mb: float, extra: int, statuses: list[int]) -> None:
    chunk = int(chunk_mb * MiB)
    body_of = {}
    with httpx.Client(base_url=host, headers={"Authorization": f"Bearer {key}"}, timeout=300) as http:
        sent = 0
        requests = int(total_mb * MiB // chunk) + extra
        for _ in range(requests):
            if chunk not in body_of:  # the JSON of `chunk` newlines, built once
                body_of[chunk] = json.dumps({"start": 0, "end": 0, "text": "\n" * chunk})[:-1]
            body = body_of[chunk].replace('"start": 0, "end": 0', f'"start": {sent}, "end": {sent + chunk}', 1) + "}"
            answer = http.post(f"/api/v1/runs/{RUN}/log", content=body, headers={"content-type": "application/json"})
            statuses.append(answer.status_code)
            if answer.status_code == 200:
                sent = int(answer.json()["cursor"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attack-mb", type=float, default=60.0, help="MiB of newlines posted (the report's 60 MB)")
    parser.add_argument("--chunk-mb", type=float, default=1.0, help="MiB of newlines per request (the most allowed)")
    parser.add_argument("--extra", type=int, default=8, help="requests after the attack's MiB (refused past the limit)")
    parser.add_argument("--browsers", type=int, default=3)
    parser.add_argument("--poll-s", type=float, default=5.0, help="each browser's live refresh period (the page's)")
    parser.add_argument("--reload-s", type=float, default=15.0, help="each browser's page reload period")
    parser.add_argument("--seconds", type=float, default=30.0, help="the attack phase's bound")
    parser.add_argument("--baseline-s", type=float, default=5.0)
    parser.add_argument("--db", help="database URL (default: SQLite in a temp folder)")
    parser.add_argument("--server-src", type=Path, help="run the server from this src folder (default: this one)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ember-flood-"))
    url = args.db or f"sqlite:///{root / 'server.db'}"
    where = ["--db", url, "--data", str(root / "data")]
    _cli(args.server_src, "init", "--admin", "admin", *where)
    victim_key = _cli(args.server_src, "user", "add", "bob", *where)
    attacker_key = _cli(args.server_src, "user", "add", "mallory", *where)
    port = _port()
    env = dict(os.environ)
    if args.server_src is not None:
        env["PYTHONPATH"] = str(args.server_src)
    argv = [sys.executable, "-m", "ember.server.cli", "server", *where, "--port", str(port), "--log-level", "warning"]
    server = subprocess.Popen(argv, env=env)
    host = f"http://127.0.0.1:{port}"
    samples: list[tuple[float, float]] = []
    sampling = threading.Event()

    def sample() -> None:
        began = time.monotonic()
        while not sampling.is_set():
            samples.append((time.monotonic() - began, _rss_mib(server.pid)))
            time.sleep(0.2)

    try:
        for _ in range(300):
            try:
                httpx.get(f"{host}/api/v1/openapi.json", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        body = {"folder": "flood", "make_folder": True, "run": {"id": RUN, "name": "flood", "status": "Running"}}
        headers = {"Authorization": f"Bearer {attacker_key}"}
        httpx.put(f"{host}/api/v1/runs/{RUN}", json=body, headers=headers).raise_for_status()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        base = _measure_victim(host, victim_key, args.baseline_s)
        baseline = base.queue.get()  # type: ignore[attr-defined]
        base.join()
        rss_before = _rss_mib(server.pid)
        marker = len(samples)
        victim = _measure_victim(host, victim_key, args.seconds)
        stop, statuses, page_times, failures = threading.Event(), [], [], []
        browsers = [
            threading.Thread(
                target=_browser, args=(host, attacker_key, args.poll_s, args.reload_s, stop, page_times, failures)
            )
            for _ in range(args.browsers)
        ]
        for b in browsers:
            b.start()
        began, posting_from = time.monotonic(), time.time()
        attacker = threading.Thread(
            target=_attack, args=(host, attacker_key, args.attack_mb, args.chunk_mb, args.extra, statuses)
        )
        attacker.start()
        attacker.join(args.seconds)
        attack_s, posting_to = time.monotonic() - began, time.time()
        attacked = victim.queue.get()  # type: ignore[attr-defined]  # the victim stops after --seconds
        victim.join()
        stop.set()
        for b in browsers:
            b.join(120)
        sampling.set()
        during = [rss for _, rss in samples[marker:]]
        stored = httpx.get(f"{host}/api/v1/runs/{RUN}", headers=headers).json()["cursors"].get("stdout.log", 0)
    finally:
        server.terminate()
        server.wait(30)
    print(f"server: {'this checkout' if args.server_src is None else args.server_src}; database: {url.split('://')[0]}")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"attack: {len(statuses)} requests of {args.chunk_mb:g} MiB of newlines in {attack_s:.1f} s "
        f"({', '.join(f'{statuses.count(s)} x {s}' for s in sorted(set(statuses)))}); "
        f"stored: {stored / MiB:.1f} MiB"
    )
    print(
        f"{args.browsers} browsers (live every {args.poll_s:g} s, page every {args.reload_s:g} s): "
        f"{len(page_times)} page and /live loads, p50 {_quantile(page_times, 0.5) * 1000:.0f} "
        f"ms, p99 {_quantile(page_times, 0.99) * 1000:.0f} ms, max {max(page_times, default=0) * 1000:.0f} ms"
        + (f"; failed: {failures[:3]}" if failures else "")
    )
    print(f"{'GET /api/v1/me (bob)':28} {'count':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    posting = [t for sent, t in attacked if posting_from <= sent <= posting_to]
    rows = (
        ("before the attack", [t for _, t in baseline]),
        ("while the attacker posts", posting),
        ("after, browsers on the page", [t for sent, t in attacked if sent > posting_to]),
        ("the whole attack phase", [t for _, t in attacked]),
    )
    for label, times in rows:
        p50, p99, top = (_quantile(times, q) * 1000 for q in (0.5, 0.99, 1.0))
        print(f"{label:28} {len(times):>6} {p50:>8.1f} {p99:>8.1f} {top:>8.1f}")
    print(
        f"server memory (VmRSS): {rss_before:.0f} MiB before the attack, max {max(during, default=0):.0f} MiB during, "
        f"{during[-1] if during else 0:.0f} MiB at the end"
    )
    p99 = _quantile([t for _, t in attacked], 0.99) * 1000
    print(f"target (bob's p99 < 100 ms during the attack): {'met' if p99 < 100 else 'MISSED'} ({p99:.1f} ms)")
    return 0 if p99 < 100 else 1


if __name__ == "__main__":
    sys.exit(main())
