"""A metric's recorded mode in Chromium through `ember ui` (issue 19): the runs table's ``best (min)`` and
the compare page's highlighted best follow ``Run.define_metric``, not the metric's name.

Before, ``val/score_gap`` (its name reads as a score) was ``best (max)`` in the runs table and the
compare page highlighted and starred the run with the largest gap.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from ember import track
from tests.console.conftest import Checked
from tests.console.test_browser_local import new_page, ui, wait_listed  # noqa: F401  (ui: the fixture)

GAPS = {"gap-wide": [0.3, 0.9], "gap-narrow": [0.1, 0.2], "gap-middle": [0.5, 0.6]}
"""Per run, its val/score_gap values: the smallest is gap-narrow's 0.1; the largest, gap-wide's 0.9."""


@pytest.fixture(scope="module")
def gaps(ui: dict[str, Any]) -> dict[str, Any]:  # noqa: F811
    """Three runs in the folder ``gaps``, each recording ``val/score_gap`` as ``min``."""
    for name, values in GAPS.items():
        run = track.create_run(name=name, home=ui["store"], folder="gaps")
        run.define_metric("val/score_gap", mode="min")
        for step, value in enumerate(values):
            run.log("val", {"score_gap": value, "acc": 0.5}, step=step)
        run.finish()
    return ui


def _row(p: Checked, name: str) -> Any:
    return p.page.locator("#runs-table tbody tr", has=p.page.locator("a.run-link", has_text=name))


def test_a_metric_recorded_as_min_is_best_min_in_the_runs_table_and_on_the_compare_page(
    browser: Any, gaps: dict[str, Any]
) -> None:
    p = new_page(browser, gaps)
    for name in GAPS:  # `ember ui` indexes what changed every second
        wait_listed(p, "/ui/runs?folder=/local/gaps", name)
    header = p.page.inner_text("#runs-table th[data-col='m:val/score_gap']")
    assert "best (min)" in header, header
    assert "best (max)" in p.page.inner_text("#runs-table th[data-col='m:val/acc']")  # no record: the name rule
    for name, values in GAPS.items():
        cell = _row(p, name).locator("td[data-col='m:val/score_gap']")
        assert cell.locator(".best").inner_text() == f"{min(values):g}", name
    p.check("metric-modes-runs-table")

    p.goto("/ui/compare?folder=/local/gaps")
    deadline = time.monotonic() + 30
    while "Compare 3 runs" not in p.page.inner_text("h1") and time.monotonic() < deadline:
        p.page.wait_for_timeout(500)
        p.goto("/ui/compare?folder=/local/gaps")
    p.page.wait_for_selector("body[data-compare-ready='1']", timeout=60_000)
    rows = "els => Object.fromEntries(els.map(e => [e.querySelector('td.name a').textContent, e.dataset.run]))"
    ids = p.page.locator("#compare-runs tbody tr").evaluate_all(rows)
    best = p.page.locator("#compare-runs td.best[data-metric='val/score_gap']")
    assert best.count() == 1
    assert best.locator("xpath=..").get_attribute("data-run") == ids["gap-narrow"]  # the smallest gap
    assert best.get_attribute("title") == "the best val/score_gap of these runs (min)"
    headers = p.page.locator("#compare-runs thead th.metric").all_inner_texts()
    assert any(h.startswith("val/score_gap") and "best (min)" in h for h in headers), headers
    chart = p.page.locator("#compare-grid .chart[data-metric='val/score_gap']")
    assert chart.get_attribute("data-best-run") == ids["gap-narrow"]  # the starred point
    assert chart.get_attribute("data-best-value") == "0.1"
    p.check("metric-modes-compare")
    p.page.context.close()
