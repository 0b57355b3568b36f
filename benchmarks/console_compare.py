"""Compare page of a 60-run sweep in headless Chromium: navigation to every chart drawn (issue 33).

A real ``ember server`` process on SQLite holds 60 runs (hparams ``lr`` over two decades, ``opt``
one of three, ``seed`` 0-2; train: loss, acc, lr, ``--points`` points each; val: 3 metrics x 20
points), stored through the server's ingest in process as ``console_pages.py`` stores its runs.
Debian's Chromium (Playwright) logs in once and opens ``/ui/compare?ids=...`` of all 60: once in a
fresh context on a fresh server (nothing cached), once in a fresh context (cold browser cache),
then ``--repeat`` times in the same context (warm). The page is ready when its body carries
``data-compare-ready`` (every line chart drawn with every run, the parallel coordinates and the
scatter drawn); the time is ``performance.now()`` then, from the navigation's start. A screenshot
of the warm page goes to ``results/console/compare-60-runs-bench.png``.

    .venv/bin/python -m benchmarks.console_compare
    .venv/bin/python -m benchmarks.console_compare --points 10000 --repeat 5

The load average (``os.getloadavg()``) is printed before and after: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.server.conftest import ServerProcess

from benchmarks.console_pages import _fill
from benchmarks.page_timing import ARGS, CHROMIUM
from ember.server.services import admin
from ember.server.storage.settings import Settings

RUNS = 60
READY = "() => document.body.dataset.compareReady === '1' && performance.now()"
# When the HTML had arrived, when the last series answer and plotly.js had (ms from the navigation).
PARTS = """() => {
  const nav = performance.getEntriesByType('navigation')[0], got = performance.getEntriesByType('resource');
  const end = (part) => Math.max(0, ...got.filter(r => r.name.includes(part)).map(r => r.responseEnd));
  return [nav.responseEnd, end('/compare/series'), end('plotly.min.js')];
}"""
SHOT = Path("results/console/compare-60-runs-bench.png")


def _time_page(page: Any, url: str, parts: list[list[float]] | None = None) -> float:
    page.goto(url, wait_until="commit")
    handle = page.wait_for_function(READY, polling="raf", timeout=120_000)
    if parts is not None:
        parts.append([t / 1000 for t in page.evaluate(PARTS)])
    return float(handle.json_value()) / 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=2000, help="train points per metric of each run")
    parser.add_argument("--repeat", type=int, default=9, help="warm page views to time (median)")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    root = Path(tempfile.mkdtemp(prefix="ember-compare-"))
    settings = Settings.make(data_dir=root / "data", db_url=f"sqlite:///{root / 'server.db'}")
    key = admin.init(settings, "bench")
    print(f"load average before: {os.getloadavg()}")
    proc = ServerProcess(settings.data_dir, settings.db_url).start()
    points = args.points
    try:
        began = time.perf_counter()
        ids = [f"{i:032x}" for i in range(1, RUNS + 1)]
        for i, run_id in enumerate(ids):
            hparams = {
                "lr": 10 ** (-1 - (i % 20) / 10),
                "seed": i % 3,
                "opt": {"name": ("sgd", "adam", "adamw")[i % 3]},
            }
            _fill(settings, key, proc.url, run_id, f"sweep-{i:02d}", points, 20, hparams, shift=i / 100)
        print(f"stored {RUNS} runs x 3 metrics x {points:,} points in {time.perf_counter() - began:.1f} s")
        url = proc.url + "/ui/compare?" + "&".join(f"ids={i}" for i in ids)
        with sync_playwright() as pw:
            chromium = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            ctx = chromium.new_context(viewport={"width": 1366, "height": 900})
            page = ctx.new_page()
            page.on("pageerror", lambda e: print("page error:", e, flush=True))
            page.goto(proc.url + "/ui/login")
            page.fill("#api_key", key)
            page.click("button[type=submit]")
            page.wait_for_load_state("networkidle")
            state = ctx.storage_state()
            views: dict[str, float] = {}
            for view in ("first", "cold"):
                fresh = chromium.new_context(viewport={"width": 1366, "height": 900}, storage_state=state)
                tab = fresh.new_page()
                tab.on("pageerror", lambda e: print("page error:", e, flush=True))
                views[view] = _time_page(tab, url)
                fresh.close()
            _time_page(page, url)
            parts: list[list[float]] = []
            warm = [_time_page(page, url, parts) for _ in range(args.repeat)]
            html, data, plotly = (statistics.median(p[k] for p in parts) for k in range(3))
            SHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOT), full_page=True)
            print(
                f"compare page, {RUNS} runs x 6 metrics ({points:,} train points each): warm median "
                f"{statistics.median(warm):.3f} s (min {min(warm):.3f}, max {max(warm):.3f}, n={args.repeat}; HTML in "
                f"{html:.3f} s, series in {data:.3f} s, plotly.js in {plotly:.3f} s); "
                f"cold browser cache {views['cold']:.3f} s; first view of a fresh server {views['first']:.3f} s"
            )
            chromium.close()
    finally:
        proc.kill()
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
