"""MLflow's run page on the same data as ``console_pages.py``: navigation to every chart drawn.

A peer's figure beside ember's (issue 19, "Speed"). The same two runs — ``long``: train
``loss``, ``acc``, ``lr`` with 1,000,000 points each and val with 3 x 1,000; ``small``: 3 x 30
and 3 x 3 — in an MLflow tracking store on SQLite, served by ``mlflow server``, and its run page
(the "Model metrics" tab) opened in the same headless Chromium as ember's console, with the same
three views: the first view of a fresh server, a cold browser cache, and the median of
``--repeat`` views with the cache warm. A page is drawn when each of its plotly charts holds a
drawn line (``.js-plotly-plot`` whose trace path has points) and there are as many charts as
metrics. MLflow's metric names carry the phase as a prefix (``train/loss``), which its page
groups into sections as ember's groups by metric type.

MLflow is not one of ember's dependencies: this runs in a virtual environment of its own, and
imports nothing from ember (``benchmarks.page_timing`` holds what it shares with ``console_pages``)::

    python3 -m venv .venv-mlflow && .venv-mlflow/bin/pip install mlflow playwright
    .venv-mlflow/bin/python -m benchmarks.mlflow_pages --points 1000000 --repeat 9   # from the repository root

The runs are created through MLflow's client (the last point of each metric, so its latest
values are MLflow's own); the other points go into its ``metrics`` table in one bulk insert,
which is what MLflow's ``log_batch`` writes, 50-100x faster than 1,000 points per call.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.page_timing import ARGS, CHROMIUM, NAMES, arguments, value

DRAWN = """(want) => {
  const plots = document.querySelectorAll('.js-plotly-plot');
  if (plots.length < want) return false;
  for (const p of plots) {
    const line = p.querySelector('.scatterlayer .trace path');
    if (!line || !(line.getAttribute('d') || '').length) return false;
  }
  return performance.now();
}"""


def _points(phase: str, n: int, every: int) -> Iterator[tuple[str, float, int, int]]:
    for i in range(n):
        step = i * every
        for k, name in enumerate(NAMES):
            yield f"{phase}/{name}", value(step, k), int(1.7e12 + step * 10), step


def fill(db: Path, points: int) -> tuple[str, dict[str, str]]:
    """Create the experiment and both runs; return the experiment id and {run name: run id}."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    experiment = client.create_experiment("bench")
    ids = {}
    for label, train, val in (("long", points, 1000), ("small", 30, 3)):
        run_id = client.create_run(experiment, run_name=label).info.run_id
        ids[label] = run_id
        for phase, n in (("train", train), ("val", val)):
            every = max(1, train // max(1, val)) if phase == "val" else 1
            rows = list(_points(phase, n, every))
            client.log_batch(run_id, metrics=[Metric(*row) for row in rows[-len(NAMES) :]])
            with sqlite3.connect(db) as con:
                con.executemany(
                    "INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) VALUES (?, ?, ?, ?, ?, 0)",
                    ((k, v, t, run_id, s) for k, v, t, s in rows[: -len(NAMES)]),
                )
        client.set_terminated(run_id)
    return experiment, ids


class Server:
    """``mlflow server`` on a free port, started and stopped."""

    def __init__(self, db: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        mlflow = Path(sys.executable).with_name("mlflow")
        cmd = [str(mlflow), "server", "--backend-store-uri", f"sqlite:///{db}", "--host", "127.0.0.1", "--port"]
        self.proc = subprocess.Popen([*cmd, str(self.port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError("mlflow server did not answer /health within 180 s")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def _time_page(page: Any, url: str) -> float:
    page.goto(url, wait_until="commit")
    handle = page.wait_for_function(DRAWN, arg=2 * len(NAMES), polling="raf", timeout=120_000)
    return float(handle.json_value()) / 1000


def main() -> int:
    args = arguments(__doc__.split("\n")[0])
    import mlflow
    from playwright.sync_api import sync_playwright

    root = Path(tempfile.mkdtemp(prefix="mlflow-pages-"))
    db = root / "mlflow.db"
    print(f"mlflow {mlflow.__version__}; load average before: {os.getloadavg()}")
    began = time.perf_counter()
    experiment, ids = fill(db, args.points)
    print(f"stored 3 x {args.points:,} points in {time.perf_counter() - began:.1f} s")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        viewport = {"width": 1366, "height": 900}
        for label, run_id in ids.items():
            url = f"/#/experiments/{experiment}/runs/{run_id}/model-metrics"
            server = Server(db)  # the first view of each run on a fresh server: nothing cached
            try:
                views = {}
                for view in ("first", "cold"):
                    fresh = chromium.new_context(viewport=viewport)
                    views[view] = _time_page(fresh.new_page(), server.url + url)
                    fresh.close()
                ctx = chromium.new_context(viewport=viewport)
                page = ctx.new_page()
                _time_page(page, server.url + url)  # the cache warm
                warm = [_time_page(page, server.url + url) for _ in range(args.repeat)]
                ctx.close()
            finally:
                server.stop()
            print(
                f"run page, {label}: warm median {statistics.median(warm):.3f} s (min {min(warm):.3f}, "
                f"max {max(warm):.3f}, n={args.repeat}); cold browser cache {views['cold']:.3f} s; "
                f"first view of a fresh server {views['first']:.3f} s"
            )
        chromium.close()
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
