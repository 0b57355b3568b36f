"""The run page's charts in Chromium (issue 19, "Run page and charts"): state that survives, the x
axes, a zoom that follows the x axis and reads finer data, ordering, filter, per-chart options,
NaN/inf marks, unique chart ids, live types and output, times with their zone, a crashed run's
duration, the output's download and a truncated search; a Trainer run's fractional epochs.

A real ``ember server`` process; the runs are sent through the HTTP API as ``ember upload`` does.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest

from ember.server.services import admin
from ember.server.storage.settings import Settings
from tests.console.conftest import Checked, new_page
from tests.server.conftest import ServerProcess

CHARTS, LONG, LIVE, CRASHED = "c" * 32, "d" * 32, "e" * 32, "f" * 32
SPIKE = 12_345
SLOW = 90_000  # ms: the waits for a 50,000-point chart's answers, on a machine other tests load too
PACKAGES = {"torch": "2.5.1", "<b>evil</b>": "<i>1</i>", "numpy": "2.1.0", "Attrs": "24.2"}


def _metrics(
    http: httpx.Client, run_id: str, type_: str, steps: list[int], metrics: dict[str, list[Any]], **kw: Any
) -> None:
    body = {
        "type": type_,
        "start": kw.get("start", 0),
        "end": kw.get("start", 0) + 1,
        "step": steps,
        "epoch": kw.get("epoch", [s / 10 for s in steps]),
        "time": kw.get("time", [1.7e9 + s for s in steps]),
        "metrics": metrics,
    }
    r = http.post(f"/runs/{run_id}/metrics", json=body)
    assert r.status_code == 200, r.text


def _run(http: httpx.Client, run_id: str, name: str, platform: Any = None, **meta: Any) -> None:
    run = {"id": run_id, "name": name, "status": "Complete", **meta}
    body = {"folder": "pages", "make_folder": True, "run": run, **({"platform": platform} if platform else {})}
    r = http.put(f"/runs/{run_id}", json=body)
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("runpage")
    settings = Settings.make(data_dir=tmp / "data", db_url=f"sqlite:///{tmp / 'server.db'}")
    key = admin.init(settings, "alice")
    proc = ServerProcess(settings.data_dir, settings.db_url).start()
    now = datetime.now(timezone.utc)
    try:
        with httpx.Client(base_url=f"{proc.url}/api/v1", headers={"Authorization": f"Bearer {key}"}) as http:
            _run(
                http,
                CHARTS,
                "charts",
                start_time="2026-01-02T10:00:00+02:00",
                end_time="2026-01-02T11:30:00+02:00",
                platform={"platform": {"hostname": "box", "packages": PACKAGES}},
            )
            steps = list(range(1, 41))
            acc = ["NaN" if s == 5 else "Infinity" if s == 7 else s / 40 for s in steps]
            _metrics(http, CHARTS, "train", steps, {"acc": acc, "loss": [1 / s for s in steps], "lr": [0.1] * 40})
            _metrics(http, CHARTS, "val", [10, 20, 30, 40], {"ema-acc": [0.1, 0.2, 0.3, 0.4]})
            _metrics(http, CHARTS, "val-ema", [10, 20, 30, 40], {"acc": [0.5, 0.6, 0.7, 0.8]})
            _metrics(http, CHARTS, "system", [1, 2, 3], {"gpu": [1.0, 2.0, 3.0]}, epoch=[None] * 3)
            lines = "".join(f"line {i} {'match' if i % 2 else 'other'}\n" for i in range(1200))
            assert (
                http.post(f"/runs/{CHARTS}/log", json={"start": 0, "end": len(lines), "text": lines}).status_code == 200
            )

            _run(http, LONG, "long")
            n = 50_000
            for i, lo in enumerate(range(0, n, 10_000)):
                steps = list(range(lo, lo + 10_000))
                loss = [1000.0 if s == SPIKE else math.sin(s / 700) for s in steps]
                _metrics(http, LONG, "train", steps, {"loss": loss}, start=i, epoch=[s / 1000 for s in steps])
            # The page's first read of it, done here: the server keeps the answer (SeriesReader).
            r = http.get(f"/runs/{LONG}/series", params={"type": "train"})
            assert r.status_code == 200 and r.json()["metrics"]["loss"]["downsampled"], r.text

            beat = now.isoformat()
            damaged = {"platform": {"hostname": "box", "packages": ["torch==2.5"]}}  # not a name -> version
            _run(http, LIVE, "live", status="Running", heartbeat=beat, start_time=beat, platform=damaged)
            _metrics(http, LIVE, "train", [1, 2, 3], {"loss": [3.0, 2.0, 1.0]})

            start, last = now - timedelta(hours=2), now - timedelta(minutes=30)
            old = (now - timedelta(hours=1, minutes=50)).isoformat()
            _run(http, CRASHED, "crashed", status="Running", heartbeat=old, start_time=start.isoformat())
            _metrics(
                http, CRASHED, "train", [1, 2], {"loss": [1.0, 0.5]}, time=[start.timestamp() + 60, last.timestamp()]
            )
        yield {"url": proc.url, "key": key, "api": f"{proc.url}/api/v1"}
    finally:
        proc.kill()


def _open(browser: Any, site: dict[str, Any], run_id: str, timeout: float = 30_000) -> Checked:
    p = new_page(browser, site["url"], accept_downloads=True)
    p.goto("/ui/login")
    p.page.fill("#api_key", site["key"])
    p.page.click("button[type=submit]")
    p.settle()
    p.goto(f"/ui/runs/{run_id}")
    p.page.wait_for_selector(".chart[data-drawn]", timeout=timeout)
    return p


def _x(p: Checked, chart: str) -> list[float]:
    return p.page.evaluate(f"Array.from(document.getElementById('{chart}').uplot.data[0])")


def _scale(p: Checked, chart: str) -> list[float]:
    return p.page.evaluate(f"(u => [u.scales.x.min, u.scales.x.max])(document.getElementById('{chart}').uplot)")


def _drag(p: Checked, chart: str, left: float, right: float) -> None:
    """Drag across a chart's plot from ``left`` to ``right`` (fractions of its width): a zoom."""
    over = p.page.locator(f"#{chart} .u-over")
    over.scroll_into_view_if_needed()  # the mouse reaches only what is in the viewport
    box = over.bounding_box()
    y = box["y"] + box["height"] / 2
    p.page.mouse.move(box["x"] + box["width"] * left, y)
    p.page.mouse.down()
    p.page.mouse.move(box["x"] + box["width"] * (left + right) / 2, y, steps=4)
    p.page.mouse.move(box["x"] + box["width"] * right, y, steps=4)
    p.page.mouse.up()


def test_charts_are_ordered_unique_marked_filtered_and_each_has_its_own_options(
    browser: Any, site: dict[str, Any]
) -> None:
    p = _open(browser, site, CHARTS)
    train = p.page.eval_on_selector_all(
        '.chart-grid[data-type="train"] .chart', "els => els.map(e => e.dataset.metric)"
    )
    assert train == ["train/loss", "train/acc", "train/lr"]  # loss first
    # 'val/ema-acc' and 'val-ema/acc' are two charts (one id before)
    ids = p.page.eval_on_selector_all(".chart", "els => els.map(e => e.id)")
    assert len(ids) == len(set(ids)) == 6
    assert p.page.get_attribute("#chart-val-ema_2d_acc", "data-metric") == "val/ema-acc"
    assert p.page.get_attribute("#chart-val_2d_ema-acc", "data-metric") == "val-ema/acc"
    # NaN and +inf: gaps in the line, marked and counted
    assert p.page.get_attribute("#chart-train-acc", "data-nonfinite") == "2"
    assert "2 NaN/inf points (first at step 5)" in p.page.inner_text("#chart-train-acc .chart-note")
    values = p.page.evaluate("Array.from(document.getElementById('chart-train-acc').uplot.data[1])")
    assert values[4] is None and values[6] is None and values[5] == 6 / 40
    p.check("run-charts")
    # per-chart log scale and smoothing: this chart only
    p.page.check("#chart-train-loss .chart-log")
    p.page.fill("#chart-train-loss .chart-smoothing", "0.5")
    assert p.page.evaluate("document.getElementById('chart-train-loss').uplot.scales.y.distr") == 3
    assert p.page.evaluate("document.getElementById('chart-train-loss').uplot.series.length") == 3
    assert p.page.evaluate("document.getElementById('chart-train-acc').uplot.scales.y.distr") == 1
    assert p.page.evaluate("document.getElementById('chart-train-acc').uplot.series.length") == 2
    # the filter box
    p.page.fill("#metric-filter", "acc")
    shown = p.page.eval_on_selector_all(".chart:not([hidden])", "els => els.map(e => e.dataset.metric)")
    assert sorted(shown) == ["train/acc", "val-ema/acc", "val/ema-acc"]
    assert p.page.locator('h3[data-type="system"]').is_hidden()
    p.page.fill("#metric-filter", "nothing-like-this")
    assert p.page.locator("#filter-none").is_visible()
    p.page.fill("#metric-filter", "")
    assert p.page.locator(".chart:not([hidden])").count() == 6
    assert not p.errors, p.errors


def test_zoom_survives_smoothing_log_scale_and_refreshes(browser: Any, site: dict[str, Any]) -> None:
    p = _open(browser, site, CHARTS)
    _drag(p, "chart-train-loss", 0.3, 0.6)
    zoom = _scale(p, "chart-train-loss")
    assert 5 < zoom[0] < zoom[1] < 35, zoom
    p.page.fill("#smoothing", "0.6")
    p.page.dispatch_event("#smoothing", "input")
    assert _scale(p, "chart-train-loss") == zoom
    p.page.check("#log-scale")
    assert p.page.evaluate("document.getElementById('chart-train-loss').uplot.scales.y.distr") == 3
    assert _scale(p, "chart-train-loss") == zoom
    p.page.check("#chart-train-loss .chart-log")
    p.page.uncheck("#chart-train-loss .chart-log")
    assert _scale(p, "chart-train-loss") == zoom
    p.page.locator("#chart-train-loss .u-over").dblclick()  # the whole series again
    assert _scale(p, "chart-train-loss")[1] >= 40
    p.check("run-zoomed")


def test_x_axes_step_epoch_wall_and_relative_time(browser: Any, site: dict[str, Any]) -> None:
    p = _open(browser, site, CHARTS)
    assert _x(p, "chart-train-loss")[:3] == [1, 2, 3]
    p.page.select_option("#x-axis", "epoch")
    assert _x(p, "chart-train-loss")[:3] == [0.1, 0.2, 0.3]  # as recorded, fractional
    # a metric with no epoch says so instead of an empty chart
    assert p.page.locator("#chart-system-gpu .chart-empty").is_visible()
    assert "No epoch recorded" in p.page.inner_text("#chart-system-gpu .chart-empty")
    p.page.select_option("#x-axis", "time")
    assert _x(p, "chart-train-loss")[:2] == [1.7e9 + 1, 1.7e9 + 2]
    assert p.page.evaluate("document.getElementById('chart-train-loss').uplot.scales.x.time") is True
    p.page.select_option("#x-axis", "relative")
    assert _x(p, "chart-train-loss")[:2] == [0, 1]  # seconds since the run's first record
    assert p.page.locator("#chart-system-gpu .chart-empty").is_hidden()
    p.check("run-relative-time")


def test_the_zoom_follows_the_x_axis_through_the_steps_and_comes_back_whole(browser: Any, site: dict[str, Any]) -> None:
    p = _open(browser, site, CHARTS)
    chart = "chart-train-loss"  # steps 1..40, epoch = step / 10, wall time = 1.7e9 + step
    _drag(p, chart, 0.3, 0.6)
    zoom = _scale(p, chart)
    assert 5 < zoom[0] < zoom[1] < 35, zoom
    _drag(p, "chart-system-gpu", 0.3, 0.7)  # steps 1..3 and no epoch
    gpu = _scale(p, "chart-system-gpu")
    assert 1 < gpu[0] < gpu[1] < 3, gpu
    p.page.select_option("#x-axis", "epoch")
    assert _scale(p, chart) == pytest.approx([zoom[0] / 10, zoom[1] / 10])  # the same steps
    assert p.page.locator("#chart-system-gpu .chart-empty").is_visible()  # nothing to zoom on this axis
    p.check("run-zoom-epoch")
    p.page.select_option("#x-axis", "time")
    assert _scale(p, chart) == pytest.approx([1.7e9 + zoom[0], 1.7e9 + zoom[1]], abs=1e-3)
    assert _scale(p, "chart-system-gpu") == pytest.approx([1.7e9 + gpu[0], 1.7e9 + gpu[1]], abs=1e-3)
    p.page.select_option("#x-axis", "relative")
    assert _scale(p, chart) == pytest.approx([zoom[0] - 1, zoom[1] - 1])  # seconds since step 1
    p.page.select_option("#x-axis", "step")
    assert _scale(p, chart) == zoom  # the original range, exactly
    assert _scale(p, "chart-system-gpu") == gpu  # kept in steps while it had no epoch
    p.page.locator(f"#{chart} .u-over").dblclick()  # the whole series again, on any axis after
    assert _scale(p, chart) == [1, 40]
    p.page.select_option("#x-axis", "epoch")
    assert _scale(p, chart) == [0.1, 4.0]
    assert not p.errors, p.errors


def test_a_zoomed_downsampled_chart_reads_its_steps_finer_with_the_spike_at_its_step(
    browser: Any, site: dict[str, Any]
) -> None:
    p = _open(browser, site, LONG, timeout=SLOW)
    chart = "chart-train-loss"
    assert p.page.get_attribute(f"#{chart}", "data-count") == "50000"
    coarse = int(p.page.get_attribute(f"#{chart}", "data-points") or 0)
    assert coarse <= 2000
    spike_x = p.page.evaluate(
        f"(u => u.data[0][u.data[1].indexOf(Math.max(...u.data[1]))])(document.getElementById('{chart}').uplot)"
    )
    assert spike_x == SPIKE  # the extreme at its own step
    _drag(p, chart, 0.243, 0.253)  # about 500 steps around the spike
    p.page.wait_for_selector(f"#{chart}[data-fine='1']", timeout=SLOW)
    lo, hi = _scale(p, chart)
    xs = _x(p, chart)
    inside = [x for x in xs if lo <= x <= hi]
    assert len(inside) >= 0.9 * (hi - lo)  # every step of the zoomed range (1 in 25 before)
    assert SPIKE in xs and p.page.get_attribute(f"#{chart}", "data-count") == "50000"
    p.check("run-zoom-finer")
    # on the epoch axis (step / 1000): the same steps, from the finer answer still
    p.page.select_option("#x-axis", "epoch")
    assert _scale(p, chart) == pytest.approx([lo / 1000, hi / 1000])
    assert p.page.get_attribute(f"#{chart}", "data-fine") == "1" and _x(p, chart) == [x / 1000 for x in xs]
    p.page.select_option("#x-axis", "step")
    assert _scale(p, chart) == [lo, hi]
    p.page.locator(f"#{chart} .u-over").dblclick()
    p.page.wait_for_selector(f"#{chart}[data-fine='']", timeout=SLOW)
    assert int(p.page.get_attribute(f"#{chart}", "data-points") or 0) == coarse


def test_a_live_run_shows_new_types_and_output_without_a_reload(browser: Any, site: dict[str, Any]) -> None:
    p = _open(browser, site, LIVE)
    assert p.page.locator(".chart").count() == 1
    _drag(p, "chart-train-loss", 0.2, 0.7)
    zoom = _scale(p, "chart-train-loss")
    assert 1 < zoom[0] < zoom[1] < 3, zoom
    with httpx.Client(base_url=site["api"], headers={"Authorization": f"Bearer {site['key']}"}) as http:
        _metrics(http, LIVE, "val", [3], {"acc": [0.5]})
        _metrics(http, LIVE, "train", [4, 5], {"loss": [0.8, 0.6]}, start=1)
        text = "epoch 1 done\n"
        assert http.post(f"/runs/{LIVE}/log", json={"start": 0, "end": len(text), "text": text}).status_code == 200
    p.page.wait_for_selector("#chart-val-acc[data-drawn]", timeout=15_000)
    p.page.wait_for_function("document.getElementById('chart-train-loss').dataset.points === '5'", timeout=15_000)
    p.page.wait_for_function(
        "document.getElementById('log-lines').textContent.includes('epoch 1 done')", timeout=15_000
    )
    assert p.page.locator('h3[data-type="val"] a').count() == 2  # its downloads
    assert _scale(p, "chart-train-loss") == zoom  # the refresh kept the zoom
    assert _x(p, "chart-train-loss") == [1, 2, 3, 4, 5]
    p.check("run-live")


def test_times_have_their_zone_a_crash_lasts_until_its_last_record_and_the_output_downloads(
    browser: Any, site: dict[str, Any]
) -> None:
    p = _open(browser, site, CHARTS)
    assert p.page.inner_text("#run-started") == "2026-01-02 10:00:00 UTC+02:00"
    assert p.page.inner_text("#run-duration") == "1h 30m"
    p.page.fill("#log_q", "match")
    p.page.click("#log button[type=submit]")
    p.settle()
    assert "600 lines contain “match”: the last 500 are shown" in p.page.inner_text("#log-truncated")
    with p.page.expect_download() as download:
        p.page.click("#log-download")
    whole = Path(download.value.path()).read_text()
    assert whole.count("\n") == 1200 and whole.startswith("line 0 other")
    p.check("run-log-search")

    crashed = _open(browser, site, CRASHED)
    assert crashed.page.inner_text("#run-status") == "Crashed"
    # its heartbeat stopped 1h50m ago, its last point is 30 min old: 1h30m since its start
    assert crashed.page.inner_text("#run-duration").startswith("1h 30m")
    assert "last record" in crashed.page.inner_text("#run-ended")
    crashed.check("run-crashed")


def test_platform_lists_the_installed_packages_sorted_and_escaped(browser: Any, site: dict[str, Any]) -> None:
    p = _open(browser, site, CHARTS)
    summary = p.page.locator("#packages summary")
    assert summary.inner_text() == "Installed packages (4)"
    assert p.page.locator("#packages table").is_hidden()  # collapsed
    summary.click()
    rows = p.page.eval_on_selector_all(
        "#packages tr", "trs => trs.map(tr => [tr.cells[0].textContent, tr.cells[1].textContent])"
    )
    assert rows == [["<b>evil</b>", "<i>1</i>"], ["Attrs", "24.2"], ["numpy", "2.1.0"], ["torch", "2.5.1"]]
    assert p.page.locator("#packages b, #packages i").count() == 0  # text, not markup
    # an old run (no platform record) and a damaged one (packages not a mapping) still show their page
    for run_id in (LONG, LIVE):
        p.goto(f"/ui/runs/{run_id}")
        assert p.page.locator("#packages").count() == 0
        assert p.page.inner_text("#packages-none") == "No installed packages recorded."


@pytest.fixture(scope="module")
def trained(site: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> str:
    """A run of the Trainer with the TrackingHook (2 epochs of 8 steps, a validation after each),
    uploaded as ``ember upload`` does; its id."""
    from ember.track.client import Client, Credentials, upload_run
    from ember.trainer import Trainer, hooks
    from tests.trainer.helpers import loader, make_engine

    tracking = hooks.TrackingHook(name="trained", system_interval_s=None, home=str(tmp_path_factory.mktemp("store")))
    Trainer(make_engine()).fit(
        loader(64, 8), epochs=2, test_dataloader=loader(16, 8), hooks=[hooks.LossHook(), tracking]
    )
    with Client(Credentials(site["url"], site["key"])) as client:
        upload_run(tracking.run.path, folder="pages", make_folder=True, client=client)
    return tracking.run.id


def test_a_trainer_run_on_the_epoch_axis_draws_fractional_epochs_and_the_validation_at_its_epoch_end(
    browser: Any, site: dict[str, Any], trained: str
) -> None:
    p = _open(browser, site, trained)
    p.page.select_option("#x-axis", "epoch")
    train, val = _x(p, "chart-train-loss"), _x(p, "chart-val-loss")
    # every step at its place in its epoch (8 batches an epoch), not 8 points stacked at 0 and at 1
    assert train == [i / 8 for i in range(1, 17)]
    first = train[:8]  # the first epoch: strictly increasing, fractional but for its end
    assert all(a < b for a, b in pairwise(first)) and first[0] > 0 and all(x % 1 for x in first[:-1])
    assert val == [1.0, 2.0]  # the validation after the first epoch is drawn at its end, 1
    assert train.index(val[0]) == 7  # with the epoch's last train step
    p.check("run-trainer-epochs")
