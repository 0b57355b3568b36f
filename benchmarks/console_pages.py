"""Run page in headless Chromium: navigation to every chart drawn (issue 19, "Speed").

A real ``ember server`` process on SQLite holds two runs: ``long`` (train: loss, acc, lr, 1,000,000
points each, stored through the server's ingest in process as ``server_series.py`` does; val: 3
metrics x 1,000 points) and ``small`` (train: 3 metrics x 30 points, val: 3 points). Debian's
Chromium (Playwright) logs in once, then opens each run page ``--repeat`` times in the same
browser context (the HTTP cache warm, as on every page view after the first), once in a fresh context
(cold browser cache) and, before those, once in a fresh context on a fresh server (nothing cached:
the server reads the series from its block summaries). A page is drawn when every chart container
of it holds a drawn chart (``.chart[data-drawn]`` of the console, or plotly's ``.main-svg`` for an
older console); the time is ``performance.now()`` at that moment, measured from the navigation's
start. The run page fetches its series (one request per metric type) in parallel: on every page load
timed, each series request's window (PerformanceResourceTiming ``startTime`` to ``responseEnd``) must
overlap every other's; the shortest overlap is printed, and the benchmark exits with an error naming
the windows when one request ended before another started.

    .venv/bin/python -m benchmarks.console_pages
    .venv/bin/python -m benchmarks.console_pages --points 100000 --repeat 5

The load average (``os.getloadavg()``) is printed before and after: the machine is shared.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select
from tests.server.conftest import ServerProcess

from benchmarks.page_timing import ARGS, CHROMIUM, NAMES, arguments, value
from ember.server.services import admin, ingest
from ember.server.storage.db import make_engine, session_factory
from ember.server.storage.models import Run
from ember.server.storage.schemas import MetricBatch
from ember.server.storage.settings import Settings

# Drawn: every chart div of the page has a chart in it (any console version).
DRAWN = """() => {
  const grids = document.querySelectorAll('.chart-grid');
  const charts = document.querySelectorAll('.chart');
  if (!grids.length || charts.length < grids.length) return false;
  for (const c of charts) if (!(c.dataset.drawn || c.querySelector('.main-svg'))) return false;
  return performance.now();
}"""


def _fill(
    settings: Settings,
    key: str,
    host: str,
    run_id: str,
    name: str,
    train: int,
    val: int,
    hparams: dict[str, Any] | None = None,
    shift: float = 0.0,
) -> None:
    """A run ``name`` in the folder ``bench``: ``train`` points of each of NAMES, ``val`` more (``shift`` added)."""
    run = {"id": run_id, "name": name, "status": "Complete", "hparams": hparams or {}}
    body = {"folder": "bench", "make_folder": True, "run": run}
    with httpx.Client(base_url=host, headers={"Authorization": f"Bearer {key}"}) as http:
        http.put(f"/api/v1/runs/{run_id}", json=body).raise_for_status()
    engine = make_engine(settings.db_url)
    sessions = session_factory(engine)
    with sessions() as session:
        run_pk = session.scalar(select(Run.pk).where(Run.id == run_id))
    batch = 100_000
    for type_, points in (("train", train), ("val", val)):
        every = max(1, train // max(1, val)) if type_ == "val" else 1
        for i, lo in enumerate(range(0, points, batch)):
            steps = [s * every for s in range(lo, min(points, lo + batch))]
            metrics = {n: [value(s, k) + shift for s in steps] for k, n in enumerate(NAMES)}
            columns = MetricBatch(
                type=type_,
                start=i,
                end=i + 1,
                step=steps,
                epoch=[s / 1000 for s in steps],
                time=[1.7e9 + s / 100 for s in steps],
                metrics=metrics,
            )
            with sessions() as session, session.begin():
                ingest.store_metrics(session, run_pk, run_id, columns, max_points=len(NAMES) * batch)
    engine.dispose()


# When the page's HTML had arrived, when its last chart series had (ms from the navigation), and each series
# request's window: from its start to its response's last byte.
PARTS = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const series = performance.getEntriesByType('resource').filter(r => r.name.includes('/series'));
  const windows = series.map(r => [r.startTime, r.responseEnd]);
  return [nav.responseEnd, Math.max(0, ...series.map(r => r.responseEnd)), windows];
}"""


def _together(windows: list[list[float]]) -> float:
    """How long (ms) every series request of a page was in flight at once: from the last one's start to the
    first one's end. Negative when one ended before another started: they were fetched one after another."""
    return min(end for _, end in windows) - max(start for start, _ in windows)


def _time_page(page: Any, url: str, parts: list[list[Any]]) -> float:
    page.goto(url, wait_until="commit")
    handle = page.wait_for_function(DRAWN, polling="raf", timeout=60_000)
    html, data, windows = page.evaluate(PARTS)
    parts.append([html / 1000, data / 1000, windows])
    return float(handle.json_value()) / 1000


def main() -> int:
    args = arguments(__doc__.split("\n")[0])
    from playwright.sync_api import sync_playwright

    root = Path(tempfile.mkdtemp(prefix="ember-pages-"))
    settings = Settings.make(data_dir=root / "data", db_url=f"sqlite:///{root / 'server.db'}")
    key = admin.init(settings, "bench")
    print(f"load average before: {os.getloadavg()}")
    proc = ServerProcess(settings.data_dir, settings.db_url).start()
    try:
        began = time.perf_counter()
        _fill(settings, key, proc.url, "a" * 32, "long", args.points, 1000)
        _fill(settings, key, proc.url, "b" * 32, "small", 30, 3)
        print(f"stored 3 x {args.points:,} points in {time.perf_counter() - began:.1f} s")
        with sync_playwright() as pw:
            chromium = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            ctx = chromium.new_context(viewport={"width": 1366, "height": 900})
            page = ctx.new_page()
            page.goto(proc.url + "/ui/login")
            page.fill("#api_key", key)
            page.click("button[type=submit]")
            page.wait_for_load_state("networkidle")
            state = ctx.storage_state()
            serial: list[tuple[str, list[list[float]]]] = []  # page loads whose series came one by one
            for run_id, label in (("a" * 32, f"3 x {args.points:,} points"), ("b" * 32, "3 x 30 points")):
                url = f"{proc.url}/ui/runs/{run_id}"
                views: dict[str, float] = {}
                loads: list[list[Any]] = []  # loads: every page load timed, for the series requests' windows
                for view in ("first", "cold"):  # first: nothing cached anywhere; cold: the server has it
                    fresh = chromium.new_context(viewport={"width": 1366, "height": 900}, storage_state=state)
                    views[view] = _time_page(fresh.new_page(), url, loads)
                    fresh.close()
                _time_page(page, url, [])  # the cache warm
                parts: list[list[Any]] = []
                warm = [_time_page(page, url, parts) for _ in range(args.repeat)]
                loads += parts
                html = statistics.median(p[0] for p in parts)
                data = statistics.median(p[1] for p in parts)
                requests = max(len(p[2]) for p in parts)  # one per metric type when the preloads are used
                together = [_together(p[2]) for p in loads if len(p[2]) > 1]
                least = min(together, default=None)
                if least is None:
                    overlap = "nothing to overlap"
                elif least > 0:
                    overlap = f"in flight together for {least:.0f} ms or more"
                else:
                    overlap = f"NOT in parallel: one ended up to {-least:.0f} ms before another started"
                print(
                    f"run page, {label}: warm median {statistics.median(warm):.3f} s "
                    f"(min {min(warm):.3f}, max {max(warm):.3f}, n={args.repeat}; HTML in {html:.3f} s, "
                    f"series in {data:.3f} s, {requests} series requests, {overlap}); "
                    f"cold browser cache {views['cold']:.3f} s; first view of a fresh server {views['first']:.3f} s"
                )
                serial += [(label, p[2]) for p in loads if len(p[2]) > 1 and _together(p[2]) <= 0]
            chromium.close()
    finally:
        proc.kill()
    print(f"load average after: {os.getloadavg()}")
    if serial:
        label, windows = serial[0]
        shown = ", ".join(f"{start:.0f}-{end:.0f} ms" for start, end in windows)
        raise SystemExit(
            f"the run page fetched its series one after another, not in parallel: {len(serial)} page loads "
            f"where a series request ended before another started (the first, {label}: {shown} from the "
            "navigation's start; each request's PerformanceResourceTiming startTime to responseEnd)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
