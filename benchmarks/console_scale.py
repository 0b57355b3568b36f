"""``ember ui`` and the folder listing as the store grows (issue 18, items 10 and 13).

The parts, each in fresh processes so that one cannot warm another:

* ``ui``: stores of 100 to 10,000 runs (written directly in ember's layout: ``run.json``,
  ``platform.json``, a line of ``stdout.log`` and 20 ``train`` points each). ``ember ui`` is started
  in its own process (real uvicorn, real HTTP) and polled every 0.1 s from its start: when the
  runs page first answers, when its first page holds the 50 newest runs, when every run is
  listed and counted, when every run's points are read; then, once indexed, the median and p90
  of 20 warm requests of the runs page (``/ui/runs``,
  the target), the page of a folder (``/ui/folders?path=/local/default``) and the last page of the
  runs table; and the process's CPU while idle for ``--idle-seconds`` (10 s; the index's passes).
* ``big``: the store of issue 33 item 4: 65 runs of 20 points and, newest, one of ``--big-points``
  (1,000,000). ``ember ui --data DIR`` started, polled as above: when the folder page counts all
  66 runs, when every run's points are read; then stopped (SIGTERM) and started again on the same
  ``DIR``: the same two times (a restart reads only what follows its cursors).
* ``index``: ``ember ui``'s index in process for stores of N runs (no HTTP, no page polled, so
  the CPU seconds hardly move with the machine's load): CPU and wall seconds until every run is
  listed and counted on a cold start, and again on a restart on the same ``--data`` (after every
  point was read), which reads only what changed (here nothing).
* ``folders``: a server with 100 to 10,000 runs in one folder (filled straight into its tables,
  as ``console_runs_table.py`` does); in process (``TestClient``, no network), the median of
  ``--repeat`` answers of ``GET /api/v1/folders`` (its first page, and its last page reached by
  following ``next_page_token``), and their size.

    .venv/bin/python -m benchmarks.console_scale                      # both, 100-10,000 runs
    .venv/bin/python -m benchmarks.console_scale ui --sizes 100 5000
    .venv/bin/python -m benchmarks.console_scale big
    .venv/bin/python -m benchmarks.console_scale index --sizes 5000
    .venv/bin/python -m benchmarks.console_scale --src /tmp/old/src   # another checkout (before/after)

The load average (``os.getloadavg()``) is printed before and after: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import python_json

ROOT = Path(__file__).resolve().parents[1]
_POINT = '{{"step":{s},"epoch":0,"time":{t:.3f},"metrics":{{"loss":{l!r},"acc":{a!r}}}}}\n'


def write_store(home: Path, runs: int) -> list[str]:
    """``runs`` finished runs, run ``i`` created ``i`` seconds after the first; their names, newest first."""
    folder = home / "runs"
    names = []
    for i in range(runs):
        stamp = f"{i // 3600 % 24:02d}{i // 60 % 60:02d}{i % 60:02d}"
        start = f"2026-01-{1 + i // 86400:02d}T{stamp[:2]}:{stamp[2:4]}:{stamp[4:]}.000+00:00"
        path = folder / f"run{i:05d}_2601{1 + i // 86400:02d}_{stamp}_{i % 10**6:06d}"
        (path / "metrics").mkdir(parents=True)
        meta = {"format": "ember.run/1", "id": uuid.uuid4().hex, "name": f"run{i:05d}", "folder": "default",
                "labels": [], "description": "", "status": "Complete", "start_time": start, "end_time": start,
                "heartbeat": start, "pid": 1, "hostname": "bench", "hparams": {"lr": 0.001 * (i % 7), "seed": i},
                "resumes": [], "reason": None}  # fmt: skip
        (path / "run.json").write_text(json.dumps(meta, indent=2) + "\n")
        (path / "platform.json").write_text("{}\n")
        (path / "stdout.log").write_text(f"run {i}\n")
        with open(path / "metrics" / "train.jsonl", "w") as f:
            f.write("".join(_POINT.format(s=k, t=1.7e9 + k, l=1.0 / (k + 1), a=k * 1e-3) for k in range(20)))
        names.append(f"run{i:05d}")
    return names[::-1]


def _poll(http: httpx.Client, proc: subprocess.Popen[bytes], log: Path, path: str) -> httpx.Response | None:
    """``path`` from the `ember ui` process once it answers (logged in through the link it printed), else None."""
    if proc.poll() is not None:
        raise RuntimeError(f"ember ui exited: {log.read_text()[-2000:]}")
    entry = re.search(r"http://127\.0\.0\.1:\d+/ui/\?token=\S+", log.read_text())
    try:
        if entry and not http.cookies:
            http.get(entry.group(0))
        page = http.get(path) if http.cookies else None
    except httpx.HTTPError:
        return None
    return page if page is not None and page.status_code == 200 else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(http: httpx.Client, url: str, repeat: int = 20) -> tuple[float, float]:
    """Median and p90 seconds of ``repeat`` answers of ``url`` (each must be a 200)."""
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        answer = http.get(url)
        times.append(time.perf_counter() - began)
        assert answer.status_code == 200, (url, answer.status_code, answer.text[:300])
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))]


def ui(
    src: Path, sizes: list[int], tmp: Path, idle_s: float = 10.0, counted_only: bool = False, poll_s: float = 0.1
) -> None:
    print("ember ui: seconds from the process's start; warm pages: median / p90 of 20, milliseconds")
    print(f"{'runs':>7}  {'1st page':>8}  {'newest 50':>9}  {'all listed':>11}  {'all points':>10}  {'/ui/runs':>13}  "
          f"{'folder page':>13}  {'last page':>13}  {'idle CPU':>8}")  # fmt: skip
    for size in sizes:
        home = tmp / f"ui-{size}"
        newest = write_store(home, size)[:50]
        port = _free_port()
        env = {**os.environ, "PYTHONPATH": str(src)}
        argv = [sys.executable, "-m", "ember.server.cli", "ui", "--store", str(home), "--port", str(port)]
        log = tmp / f"ui-{size}.log"
        began = time.monotonic()
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            first = complete = done = None
            polls, done_cpu = 0, 0.0
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as http:
                while done is None:
                    page = _poll(http, proc, log, "/ui/runs")
                    if page is not None:
                        polls += 1
                        now = time.monotonic() - began
                        first = first if first is not None else now
                        shown = re.findall(r'class="run-link" href="[^"]+">([^<]*)</a>', page.text)
                        if complete is None and shown == newest:
                            complete = now
                        if f"({size})" in page.text and "Reading the store" not in page.text:
                            done, done_cpu = now, _cpu_s(proc.pid)
                            break
                    time.sleep(poll_s)
                print(f"{size:>7,}  listed and counted at {done:.1f} s; reading the points...", flush=True)
                if not counted_only:
                    while 'id="indexing"' in http.get("/ui/runs").text:  # the runs' points still being read
                        time.sleep(0.1)
                    points = time.monotonic() - began
                    runs = _timed(http, "/ui/runs")
                    folder = _timed(http, "/ui/folders?path=/local/default")
                    last = _timed(http, f"/ui/runs?page={(size + 49) // 50}")
                    cpu = _cpu_s(proc.pid)
                    time.sleep(idle_s)
                    idle = (_cpu_s(proc.pid) - cpu) / idle_s
        finally:
            proc.terminate()
            proc.wait(30)
        newest_s = complete if complete is not None else float("nan")
        if counted_only:
            print(
                f"{size:>7,}  first page {first:.1f} s, newest 50 {newest_s:.1f} s, all counted {done:.1f} s "
                f"(ember ui's CPU by then: {done_cpu:.1f} s; {polls} pages polled)",
                flush=True,
            )
            shutil.rmtree(home)
            continue
        warm = "  ".join("{:>6.0f} / {:<4.0f}".format(*(t * 1e3 for t in pair)) for pair in (runs, folder, last))
        print(
            f"{size:>7,}  {first:>8.1f}  {newest_s:>9.1f}  {done:>11.1f}  {points:>10.1f}  {warm}  {idle:>7.1%}",
            flush=True,
        )
        shutil.rmtree(home)


def _python(src: Path, code: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter (``src`` and this checkout on the path); it prints one JSON line."""
    return python_json(code, env={"PYTHONPATH": f"{src}{os.pathsep}{ROOT}"})


def big(src: Path, tmp: Path, points: int, runs: int = 65) -> None:
    print(f"ember ui: {runs} runs of 20 points and one of {points:,}, newest; seconds from the process's start")
    home, data = tmp / "big", tmp / "big-data"
    write_store(home, runs + 1)
    (newest,) = (home / "runs").glob(f"run{runs:05d}_*")
    with open(newest / "metrics" / "train.jsonl", "w") as f:
        for first in range(0, points, 100_000):
            chunk = range(first, min(first + 100_000, points))
            f.write("".join(_POINT.format(s=k, t=1.7e9 + k, l=1.0 / (k + 1), a=k * 1e-6) for k in chunk))
    env = {**os.environ, "PYTHONPATH": str(src)}
    for start in ("cold start", "restart on --data"):
        port = _free_port()
        argv = [sys.executable, "-m", "ember.server.cli", "ui", "--store", str(home), "--port", str(port)]
        log = tmp / "big.log"
        began = time.monotonic()
        with open(log, "wb") as out:
            proc = subprocess.Popen([*argv, "--data", str(data)], stdout=out, stderr=subprocess.STDOUT, env=env)
        counted = None
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as http:
                while True:
                    page = _poll(http, proc, log, "/ui/folders?path=/local/default")
                    if page is not None:
                        text = page.text
                        if (
                            counted is None
                            and f"({runs + 1:,} in this folder" in text
                            and "Reading the store" not in text
                        ):
                            counted = time.monotonic() - began
                        if 'id="indexing"' not in text:
                            break
                    time.sleep(0.1)
            read = time.monotonic() - began
        finally:
            proc.terminate()
            proc.wait(60)
        print(f"{start:>18}: all {runs + 1} runs counted {counted:.1f} s, every point read {read:.1f} s", flush=True)


def index(src: Path, sizes: list[int], tmp: Path) -> None:
    """``ember ui``'s index in process, no HTTP: CPU and wall seconds to list and count every run of a cold
    start, then (every point read, the app built again on the same ``--data``) of a restart."""
    print("ember ui's index in process (no pages polled): listing and counting every run, CPU / wall seconds")
    print(f"{'runs':>7}  {'cold start':>15}  {'restart':>15}")
    for size in sizes:
        home = tmp / f"index-{size}"
        write_store(home, size)
        result = _python(
            src,
            f"""
            import json, time
            from pathlib import Path
            from ember.server.local.ui import build_app
            home, data = Path({str(home)!r}), Path({str(tmp)!r}) / "index-data-{size}"
            times = []
            for start in range(2):
                app, _ = build_app(home, 8766, data)
                index = app.state.console_index
                cpu, wall = time.process_time(), time.perf_counter()
                while index._runs.pending or index._runs.indexed < {size}:
                    index.step()
                times.append((time.process_time() - cpu, time.perf_counter() - wall))
                while index.step():  # every point read before the restart
                    pass
            print(json.dumps({{"times": times}}))
            """,
        )
        (cold_cpu, cold_wall), (again_cpu, again_wall) = result["times"]
        print(f"{size:>7,}  {cold_cpu:>6.2f} / {cold_wall:<6.2f}  {again_cpu:>6.2f} / {again_wall:<6.2f}", flush=True)
        shutil.rmtree(home)


def folders(src: Path, sizes: list[int], repeat: int, tmp: Path) -> None:
    print(f"GET /api/v1/folders of a folder of N runs: median of {repeat}, in process")
    print(f"{'runs':>7}  {'first page ms':>13}  {'KB':>7}  {'runs in it':>10}  {'last page ms':>12}  {'pages':>5}")
    for size in sizes:
        result = _python(
            src,
            f"""
            import json, statistics, time, warnings
            warnings.filterwarnings("ignore")
            from pathlib import Path
            from fastapi.testclient import TestClient
            from ember.server.services import admin
            from ember.server.app import create_app
            from ember.server.storage.settings import Settings
            from benchmarks.console_runs_table import fill
            data = Path({str(tmp)!r}) / "folders-{size}"
            settings = Settings.make(data_dir=data, db_url=f"sqlite:///{{data / 'bench.db'}}")
            key = admin.init(settings, "alice")
            app = create_app(settings)
            fill(app, {size})
            auth = {{"Authorization": f"Bearer {{key}}"}}
            def timed(params):
                times = []
                for _ in range({repeat} + 1):
                    t = time.perf_counter()
                    answer = client.get("/api/v1/folders", params=params, headers=auth)
                    times.append(time.perf_counter() - t)
                    assert answer.status_code == 200, answer.text[:300]
                return statistics.median(times[1:]), answer
            with TestClient(app) as client:
                first, answer = timed({{"path": "/alice/bench"}})
                size, shown, token, pages = len(answer.content), len(answer.json()["runs"]), None, 1
                token = answer.json().get("next_page_token")
                last = first
                while token:
                    params = {{"path": "/alice/bench", "page_token": token}}
                    page = client.get("/api/v1/folders", params=params, headers=auth).json()
                    pages += 1
                    if not page["next_page_token"]:
                        last, _ = timed(params)
                    token = page["next_page_token"]
            print(json.dumps({{"first": first, "kb": size / 1024, "shown": shown, "last": last, "pages": pages}}))
            """,
        )
        print(f"{size:>7,}  {result['first'] * 1e3:>13.1f}  {result['kb']:>7.1f}  {result['shown']:>10,}  "
              f"{result['last'] * 1e3:>12.1f}  {result['pages']:>5}", flush=True)  # fmt: skip
        shutil.rmtree(tmp / f"folders-{size}", ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("parts", nargs="*", metavar="PART", help="ui, big, index, folders (default: ui, folders)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1_000, 5_000, 10_000], help="runs")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--big-points", type=int, default=1_000_000, help="points of the big run (part big)")
    parser.add_argument(
        "--counted-only", action="store_true", help="part ui: stop once every run is listed and counted"
    )
    parser.add_argument("--poll", type=float, default=0.1, help="part ui: seconds between polls of the runs page")
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="how long ember ui's idle CPU is measured")
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the ember source tree to measure")
    args = parser.parse_args()
    args.parts = args.parts or ["ui", "folders"]
    unknown = set(args.parts) - {"ui", "big", "index", "folders"}
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}: choose among ui, big, index, folders")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"ember from {args.src}; load average {load}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="ember-console-scale-"))
    began = time.perf_counter()
    try:
        if "ui" in args.parts:
            ui(args.src, args.sizes, tmp, args.idle_seconds, args.counted_only, args.poll)
        if "big" in args.parts:
            big(args.src, tmp, args.big_points)
        if "index" in args.parts:
            index(args.src, args.sizes, tmp)
        if "folders" in args.parts:
            folders(args.src, args.sizes, args.repeat, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"done in {time.perf_counter() - began:.0f} s; load average {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
