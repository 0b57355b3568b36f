"""The runs table for a sweep, in Chromium through `ember ui` (issue 19, "Runs table").

Before: the first 8 hparams by name (a sweep over ``lr`` showed constants and hid ``lr``), nested
hparams as one blob, "best" the maximum of anything not named like a loss (``grad_norm``), the
name scrolled away, no way to pick columns, a filter typo replaced the page with a 422 and an
unknown key answered 0 runs silently, "Clear" dropped the folder, a Crashed run's duration
ended at its heartbeat (its run page: at its last record) and times had no zone (but on the run
page).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from ember import track
from ember.track import cli as track_cli
from tests.console.conftest import RESULTS, Checked
from tests.console.test_browser_local import new_page, ui  # noqa: F401  (ui: the fixture)

SWEEP = "/ui/runs?folder=/local/sweep"
CRASHED = "/ui/runs?folder=/local/crashed"
LIVE = "/ui/runs?folder=/local/live"
LRS = (0.1, 0.01, 0.001)
INDEXED_S = 120.0
"""How long `ember ui` may take to index what a test wrote (it looks every second; a loaded machine is slower)."""
TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


@pytest.fixture(scope="module")
def sweep(browser: Any, ui: dict[str, Any]) -> Iterator[dict[str, Any]]:  # noqa: F811
    """Three runs of a sweep over lr (and a nested beta), beside constants, in folder ``sweep``; a
    run whose process died in folder ``crashed``; a run still running in ``live``; all of it indexed
    by `ember ui`."""
    consts = {"batch_size": 32, "epochs": 3, "seed": 0, "amp": "bf16", "accum": 1, "clip": 1.0, "dropout": 0.1}
    for i, lr in enumerate(LRS):
        hparams = {**consts, "lr": lr, "config": {"opt": {"name": "adam", "beta": 0.9 if i else 0.99}}}
        run = track.create_run(name=f"sweep-{i}", home=ui["store"], folder="sweep", hparams=hparams)
        for step in range(10):
            metrics = {"loss": 1 / (step + 1) + lr, "acc": step / 10 + i / 100, "grad_norm": 3.0 - step * 0.2 + i}
            run.log("train", metrics, step=step)
        run.finish()
    crashed_start = _write_crashed(ui["store"])
    live = track.create_run(name="live-0", home=ui["store"], folder="live")  # Running: this process is alive
    live.log("train", {"loss": 1.0}, step=0)
    p = new_page(browser, ui)
    _wait_for(p, SWEEP, lambda rows: rows == ["sweep-0 Complete 0.9", "sweep-1 Complete 0.91", "sweep-2 Complete 0.92"])
    _wait_for(p, CRASHED, lambda rows: rows == ["crashed-0 Crashed 0.5"])
    _wait_for(p, LIVE, lambda rows: rows == ["live-0 Running 1"])
    p.page.context.close()
    yield {**ui, "crashed_start": crashed_start}
    live.finish()


def _write_crashed(store: Path) -> str:
    """A run killed 2 h after it started, in zone UTC+02:00: Running in its run.json, its heartbeat
    stopped after 10 minutes (its thread died), its last point 30 minutes ago. Returns its start."""
    now = datetime.now(timezone.utc).replace(microsecond=0)
    start, last = now - timedelta(hours=2), now - timedelta(minutes=30)
    path = store / "runs" / f"crashed_{start:%y%m%d_%H%M%S}_dead00"
    (path / "metrics").mkdir(parents=True)
    meta = {
        "format": "ember.run/1", "id": "c" * 32, "name": "crashed-0", "folder": "crashed", "labels": [],
        "description": "", "status": "Running", "end_time": None, "pid": 1, "hostname": "elsewhere",
        "start_time": start.astimezone(timezone(timedelta(hours=2))).isoformat(),
        "heartbeat": (start + timedelta(minutes=10)).isoformat(), "hparams": {}, "resumes": [], "reason": None,
    }  # fmt: skip
    (path / "platform.json").write_text("{}")
    (path / "stdout.log").write_text("step 1\n")
    points = [(0, start + timedelta(minutes=1), 1.0), (1, last, 0.5)]
    lines = [json.dumps({"step": s, "epoch": 0, "time": t.timestamp(), "metrics": {"loss": v}}) for s, t, v in points]
    (path / "metrics" / "train.jsonl").write_text("".join(line + "\n" for line in lines))
    (path / "run.json").write_text(json.dumps(meta))  # last: the run is complete on disk when it is found
    return str(meta["start_time"])


def _wait_for(p: Checked, path: str, ready: Callable[[list[str]], bool]) -> None:
    """Open ``path`` until its rows (``name status last-value-of-the-first-metric``, by name) are ``ready``.

    `ember ui` indexes what changed every second: a run's link may show before all its points do.
    """
    deadline = time.monotonic() + INDEXED_S
    while True:
        p.goto(path)
        rows = p.page.eval_on_selector_all(
            "#runs-table tbody tr:has(a.run-link)",
            """trs => trs.map(tr => [tr.querySelector('a.run-link'), tr.querySelector('.status'),
                                     tr.querySelector('td.metric .last')].map(e => e && e.textContent).join(' '))""",
        )
        if ready(sorted(rows)):
            return
        assert time.monotonic() < deadline, (path, rows)
        p.page.wait_for_timeout(250)


def _follow(p: Checked, selector: str) -> None:
    """Click what leads to another page and wait for that page (not the one the click left)."""
    with p.page.expect_navigation():
        p.page.click(selector)
    p.settle()


def _visible_headers(p: Checked, kind: str) -> list[str]:
    cells = p.page.locator(f"#runs-table thead th.{kind}")
    return [cells.nth(i).get_attribute("data-col") or "" for i in range(cells.count()) if cells.nth(i).is_visible()]


def test_a_sweep_shows_the_hparams_that_vary_and_each_metrics_last_best_min_and_max(
    browser: Any, sweep: dict[str, Any]
) -> None:
    p = new_page(browser, sweep)
    p.goto(SWEEP)
    assert _visible_headers(p, "hp") == ["hp:config.opt.beta", "hp:lr"]  # before: amp, accum, batch_size...
    assert _visible_headers(p, "metric") == ["m:train/acc", "m:train/grad_norm", "m:train/loss"]
    row = p.page.locator("#runs-table tbody tr", has_text="sweep-2")
    norm = row.locator("td[data-col='m:train/grad_norm']")
    assert norm.locator(".last").inner_text() == "3.2" and norm.locator(".best").inner_text() == "3.2"
    assert norm.locator(".min").inner_text() == "3.2" and norm.locator(".max").inner_text() == "5"
    assert row.locator("td[data-col='m:train/acc'] .best").inner_text() == "0.92"  # acc: the maximum
    assert "best (min)" in p.page.inner_text("#runs-table th[data-col='m:train/grad_norm']")
    _follow(p, "#runs-table th[data-col='hp:config.opt.beta'] a")  # a nested hparam sorts
    assert "sort=hp%3Aconfig.opt.beta" in p.page.url
    assert p.page.locator("a.run-link").all_inner_texts()[-1] == "sweep-0"
    p.check("runs-sweep")
    p.page.context.close()


def test_the_run_name_stays_in_view_while_the_table_scrolls_sideways(browser: Any, sweep: dict[str, Any]) -> None:
    p = new_page(browser, sweep)
    p.page.set_viewport_size({"width": 700, "height": 800})
    p.goto(SWEEP)
    wrap = p.page.locator(".table-wrap")
    assert wrap.evaluate("w => w.scrollWidth > w.clientWidth")
    before = p.page.locator("a.run-link").first.bounding_box()
    wrap.evaluate("w => { w.scrollLeft = w.scrollWidth; }")
    wrap.evaluate("w => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")  # painted
    assert wrap.evaluate("w => w.scrollLeft + w.clientWidth >= w.scrollWidth - 1")  # scrolled to the end
    after = p.page.locator("a.run-link").first.bounding_box()
    assert before and after and abs(after["x"] - before["x"]) < 1  # pinned: where it was
    x, y = after["x"] + 5, after["y"] + after["height"] / 2
    assert p.page.evaluate(f"document.elementFromPoint({x}, {y}).closest('a.run-link') !== null")  # and on top
    p.check("runs-scrolled")
    p.page.context.close()


def test_the_column_chooser_is_remembered_per_folder(browser: Any, sweep: dict[str, Any]) -> None:
    p = new_page(browser, sweep)
    p.goto(SWEEP)
    p.page.click("#columns summary")
    p.page.uncheck("#columns input[data-col='hp:lr']")
    p.page.check("#columns input[data-col='hp:batch_size']")
    p.page.uncheck("#columns input[data-col='m:train/acc']")
    assert _visible_headers(p, "hp") == ["hp:batch_size", "hp:config.opt.beta"]
    p.check("runs-columns")
    p.goto(SWEEP + "&sort=name")  # the same folder, another view: the choice holds
    assert _visible_headers(p, "hp") == ["hp:batch_size", "hp:config.opt.beta"]
    assert "m:train/acc" not in _visible_headers(p, "metric")
    assert not p.page.locator("#runs-table tbody td[data-col='hp:lr']").first.is_visible()
    p.goto("/ui/runs")  # another folder (every run): its own columns
    assert "hp:lr" in _visible_headers(p, "hp")
    p.goto(SWEEP)
    p.page.click("#columns summary")
    p.page.click("#columns-reset")
    assert _visible_headers(p, "hp") == ["hp:config.opt.beta", "hp:lr"]
    p.goto(SWEEP)
    assert _visible_headers(p, "hp") == ["hp:config.opt.beta", "hp:lr"]
    p.page.context.close()


def test_filter_errors_are_shown_beside_the_form_and_clear_keeps_the_folder(
    browser: Any, sweep: dict[str, Any]
) -> None:
    p = new_page(browser, sweep)
    p.goto(SWEEP)
    p.page.fill("input[name=where]", "lr>0.05")  # no hp: before, a bare 422 page
    _follow(p, "#filters button[type=submit]")
    assert "not understood" in p.page.inner_text("#filter-error")
    assert p.page.input_value("input[name=where]") == "lr>0.05" and p.page.locator("#filters").is_visible()
    p.check("runs-filter-error")
    p.page.fill("input[name=where]", "hp:lrr>0.05")  # a typo in the key: before, 0 runs and no word why
    _follow(p, "#filters button[type=submit]")
    assert "no run here has the hyper-parameter 'lrr'" in p.page.inner_text("#filter-error")
    p.page.fill("input[name=where]", "hp:config.opt.name=Adam")  # a value no run has: which there are
    _follow(p, "#filters button[type=submit]")
    assert 'config.opt.name here is one of "adam"' in p.page.inner_text("#filter-error")
    p.page.fill("input[name=where]", "hp:config.opt.beta>0.95")
    _follow(p, "#filters button[type=submit]")
    assert p.page.locator("a.run-link").all_inner_texts() == ["sweep-0"]
    assert p.page.locator("#filter-error").count() == 0
    _follow(p, "#clear")
    assert "folder=%2Flocal%2Fsweep" in p.page.url and "where" not in p.page.url
    assert sorted(p.page.locator("a.run-link").all_inner_texts()) == ["sweep-0", "sweep-1", "sweep-2"]
    p.check()
    p.page.context.close()


def test_an_hparam_sorted_or_filtered_on_is_shown_though_it_is_constant(browser: Any, sweep: dict[str, Any]) -> None:
    """Issue 19: a sweep "hides ``lr``, even while sorting by it". Columns sorted or filtered on
    are shown beside those that vary, constant or not."""
    p = new_page(browser, sweep)
    p.goto(SWEEP)
    assert _visible_headers(p, "hp") == ["hp:config.opt.beta", "hp:lr"]  # seed and amp: constant, hidden
    p.goto(SWEEP + "&sort=-hp:seed")
    assert _visible_headers(p, "hp") == ["hp:config.opt.beta", "hp:lr", "hp:seed"]
    assert p.page.inner_text("#runs-table th[data-col='hp:seed']") == "seed ▼"
    assert p.page.locator("#runs-table tbody td[data-col='hp:seed']").all_inner_texts() == ["0", "0", "0"]
    p.goto(SWEEP)
    p.page.fill("input[name=where]", "hp:amp=bf16")
    _follow(p, "#filters button[type=submit]")
    assert _visible_headers(p, "hp") == ["hp:amp", "hp:config.opt.beta", "hp:lr"]
    assert p.page.locator("#runs-table tbody td[data-col='hp:amp']").all_inner_texts() == ["bf16"] * 3
    p.check("runs-constant-shown")
    p.page.context.close()


def test_a_crashed_run_has_the_same_start_and_duration_in_the_table_as_on_its_page(
    browser: Any, sweep: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the table ended a Crashed run at its heartbeat (10m) where its run page ended it at
    its last point (1h 30m), and showed its start without its zone."""
    p = new_page(browser, sweep)
    p.goto(CRASHED)
    row = p.page.locator("#runs-table tbody tr", has_text="crashed-0")
    start, duration = row.locator("td.start").inner_text(), row.locator("td.duration").inner_text()
    assert duration == "1h 30m"  # from its start to its last point, 30 minutes ago
    assert re.fullmatch(TIME + r"\+02:00", start), start  # in the zone it was recorded in
    assert row.locator("td.start time").get_attribute("datetime") == sweep["crashed_start"]
    p.check("runs-crashed")
    _follow(p, "#runs-table a.run-link")
    assert p.page.inner_text("#run-status") == "Crashed"
    assert p.page.inner_text("#run-duration") == f"{duration} (until its last record)"
    assert p.page.inner_text("#run-started") == start
    p.page.context.close()
    # issue 33, item 10: `ember runs ls` and `show` end it at its last record too (before: at its heartbeat, 10m)
    for argv, where in ((["ls"], "crashed_"), (["show", "crashed"], "duration ")):
        assert track_cli.main(["runs", *argv, "--store", str(sweep["store"])]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(where))
        assert "1h30m00s (until its last record)" in line, line


def test_the_start_of_every_run_and_the_creation_of_an_artifact_show_their_zone(
    browser: Any, sweep: dict[str, Any]
) -> None:
    p = new_page(browser, sweep)
    p.goto("/ui/runs")
    starts = p.page.locator("#runs-table tbody td.start").all_inner_texts()
    assert len(starts) == 7 and all(re.fullmatch(TIME + r"(\+02:00)?", s) for s in starts), starts
    p.goto(f"/ui/runs/{sweep['runs'][0].id}")
    assert re.fullmatch(TIME, p.page.inner_text("#run-started"))  # the run page's format, the same
    _follow(p, "#lineage a.node-link[data-kind=artifact]")
    assert re.fullmatch(TIME, p.page.inner_text("#artifact-created")), p.page.inner_text("#artifact-created")
    p.check("artifact-created")
    p.page.context.close()


def test_a_compound_filter_keeps_only_the_runs_that_meet_every_condition(browser: Any, sweep: dict[str, Any]) -> None:
    """Issue 33, item 1: ``hp:lr<0.05 and m:train/grad_norm<3`` read everything after the first ``<`` as
    one value, so the second condition was ignored (sweep-1 and sweep-2 instead of sweep-1); ``or``,
    ``not`` and parentheses did not exist; an unreadable filter did not say where."""
    p = new_page(browser, sweep)
    p.goto(SWEEP)

    def shown(where: str) -> list[str]:
        p.page.fill("input[name=where]", where)
        _follow(p, "#filters button[type=submit]")
        return sorted(p.page.locator("a.run-link").all_inner_texts())

    assert shown("hp:lr < 0.05") == ["sweep-1", "sweep-2"]
    assert shown("m:train/grad_norm < 3") == ["sweep-0", "sweep-1"]  # the last values: 1.2, 2.2, 3.2
    assert shown("hp:lr < 0.05 and m:train/grad_norm < 3") == ["sweep-1"]
    assert p.page.locator("#filter-error").count() == 0 and "(1)" in p.page.inner_text("h1")
    assert {"hp:lr", "hp:config.opt.beta"} <= set(_visible_headers(p, "hp"))  # one run: all its hparams
    p.check("runs-compound-filter")
    assert shown("(hp:lr = 0.1 or hp:config.opt.beta < 0.95) and not name = sweep-2") == ["sweep-0", "sweep-1"]
    assert shown("m:train/grad_norm.max >= 4 or status = Crashed") == ["sweep-1", "sweep-2"]  # the maxima: 3, 4, 5
    assert shown("hp:lr < 0.05 and m:train/loss.best > abc") == []
    assert "filter not understood at column 38: m:train/loss.best is a number" in p.page.inner_text("#filter-error")
    assert p.page.inner_text("#filter-at mark") == "a"  # the error, marked in what was typed
    assert p.page.evaluate("document.activeElement.name") == "where"  # the cursor waits where the error is
    assert p.page.evaluate("document.activeElement.selectionStart") == 37
    p.check("runs-filter-column")
    p.page.context.close()


def test_compare_selected_with_nothing_ticked_says_so_beside_the_button(browser: Any, sweep: dict[str, Any]) -> None:
    """Before: it opened /ui/compare with no run. Now the page stays and says what to do; a tick clears it."""
    p = new_page(browser, sweep)
    p.goto(SWEEP)
    note = p.page.locator("#compare-none")
    assert not note.is_visible()
    p.page.click("#compare")
    assert note.is_visible() and "No run is ticked" in note.inner_text()
    assert "/ui/runs" in p.page.url and "/ui/compare" not in p.page.url
    p.check("runs-compare-none")
    p.page.locator("#runs-table input[name=ids]").first.check()
    assert not note.is_visible()
    with p.page.expect_navigation():
        p.page.click("#compare")
    assert "/ui/compare?ids=" in p.page.url
    p.page.context.close()


def test_a_best_max_column_sorts_best_first_and_best_min_and_max_sort_on_both_pages(
    browser: Any, sweep: dict[str, Any]
) -> None:
    """Issue 33, item 8: the first click on a "best (max)" header sorted the worst first; best, min and
    max did not sort at all; the folder page's headers did not sort."""
    p = new_page(browser, sweep)
    p.goto(SWEEP)
    _follow(p, "#runs-table th[data-col='m:train/acc'] a[data-sort='m:train/acc']")  # acc: best (max)
    assert "sort=-m%3Atrain%2Facc" in p.page.url  # the first click: descending, the best first
    assert p.page.locator("a.run-link").all_inner_texts() == ["sweep-2", "sweep-1", "sweep-0"]  # 0.92 0.91 0.9
    assert p.page.inner_text("#runs-table th[data-col='m:train/acc'] a[data-sort='m:train/acc']") == "train/acc ▼"
    _follow(p, "#runs-table th[data-col='m:train/acc'] a[data-sort='m:train/acc']")  # again: reversed
    assert p.page.locator("a.run-link").all_inner_texts() == ["sweep-0", "sweep-1", "sweep-2"]
    _follow(p, "#runs-table a[data-sort='m:train/grad_norm.best']")  # grad_norm: best (min), the minima 1.2 2.2 3.2
    assert "sort=m%3Atrain%2Fgrad_norm.best" in p.page.url
    assert p.page.locator("a.run-link").all_inner_texts() == ["sweep-0", "sweep-1", "sweep-2"]
    RESULTS.mkdir(parents=True, exist_ok=True)
    p.page.screenshot(path=str(RESULTS / "runs-sorted-by-best.png"), full_page=True)
    p.goto("/ui/folders?path=/local/sweep")  # the folder page: the same headers, sorting its own runs
    _follow(p, "#runs-table th[data-col='m:train/acc'] a[data-sort='m:train/acc.best']")
    assert "/ui/folders?path=%2Flocal%2Fsweep&sort=-m%3Atrain%2Facc.best" in p.page.url
    assert p.page.locator("a.run-link").all_inner_texts() == ["sweep-2", "sweep-1", "sweep-0"]
    assert "sorted by a header" in p.page.inner_text("main")
    assert not p.errors, p.errors  # (every header link answers: the other tests' checks open them)
    p.page.screenshot(path=str(RESULTS / "folder-sorted.png"), full_page=True)
    p.page.context.close()


def test_a_running_run_shows_its_elapsed_time_hparams_flattened_log_scale_and_wall_time_to_the_second(
    browser: Any, sweep: dict[str, Any]
) -> None:
    """Issue 33, item 10: a running run's duration was "—"; the run page's hparams panel showed a nested
    hparam as one blob ({'opt': {...}}) where the runs table shows config.opt.beta; the wall time
    hovered to the minute. Item 8: the run page's log scale put every chart on a log axis, accuracy too."""
    p = new_page(browser, sweep)
    p.goto(LIVE)
    cell = p.page.locator("#runs-table tbody tr", has_text="live-0").locator("td.duration")
    assert re.fullmatch(r"\d+(\.\d)?s|\d+m \d\ds", cell.inner_text()), cell.inner_text()  # before: —
    _follow(p, "#runs-table a.run-link")
    assert re.fullmatch(r"(\d+(\.\d)?s|\d+m \d\ds) \(so far\)", p.page.inner_text("#run-duration"))
    p.goto(SWEEP)
    _follow(p, "#runs-table a.run-link:text('sweep-0')")
    rows = dict(
        p.page.locator("#hparams tr").evaluate_all(
            "trs => trs.map(t => [t.cells[0].textContent, t.cells[1].textContent])"
        )
    )
    assert rows["config.opt.beta"] == "0.99" and rows["config.opt.name"] == "adam" and "config" not in rows
    distr = "el => el.uplot.scales.y.distr"  # item 8: the page's log scale never puts accuracy on a log axis
    p.page.wait_for_selector("#chart-train-acc[data-drawn='1']")
    p.page.check("#log-scale")
    p.page.wait_for_function("document.querySelector('#chart-train-loss').uplot.scales.y.distr === 3")
    assert p.page.locator("#chart-train-acc").evaluate(distr) == 1  # a maximised score stays linear
    assert p.page.locator("#chart-train-grad_5f_norm").evaluate(distr) == 3  # minimised by the name rule
    p.page.locator("#chart-train-acc input.chart-log").check()  # its own box puts it on a log axis
    p.page.wait_for_function("document.querySelector('#chart-train-acc').uplot.scales.y.distr === 3")
    p.page.select_option("#x-axis", "time")
    chart = p.page.locator("#chart-train-loss")
    p.page.wait_for_function("document.querySelector('#chart-train-loss').uplot.scales.x.time === true")
    chart.scroll_into_view_if_needed()
    at = chart.evaluate(
        "el => { const r = el.uplot.over.getBoundingClientRect();"
        + " return [r.left + r.width / 2, r.top + r.height / 2]; }"
    )
    p.page.mouse.move(at[0], at[1])
    shown = chart.locator(".u-legend .u-series").first.locator(".u-value").inner_text()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", shown), shown  # before: 2026-11-27 6:41pm
    p.check("run-hparams-flattened-log-scale")
    p.page.context.close()
