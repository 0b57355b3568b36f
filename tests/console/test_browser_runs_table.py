"""The runs table for a sweep, in Chromium through `ember ui` (issue 19, "Runs table").

Before: the first 8 hparams by name (a sweep over ``lr`` showed constants and hid ``lr``), nested
hparams as one blob, "best" the maximum of anything not named like a loss (``grad_norm``), the
name scrolled away, no way to pick columns, a filter typo replaced the page with a 422 and an
unknown key answered 0 runs silently, and "Clear" dropped the folder.
"""

from __future__ import annotations

from typing import Any

import pytest

from ember import track
from tests.console.conftest import Checked
from tests.console.test_browser_local import new_page, ui, wait_listed  # noqa: F401  (ui: the fixture)

SWEEP = "/ui/runs?folder=/local/sweep"
LRS = (0.1, 0.01, 0.001)


@pytest.fixture(scope="module")
def sweep(ui: dict[str, Any]) -> dict[str, Any]:  # noqa: F811
    """Three runs of a sweep over lr (and a nested beta), beside constants, in folder ``sweep``."""
    consts = {"batch_size": 32, "epochs": 3, "seed": 0, "amp": "bf16", "accum": 1, "clip": 1.0, "dropout": 0.1}
    for i, lr in enumerate(LRS):
        hparams = {**consts, "lr": lr, "config": {"opt": {"name": "adam", "beta": 0.9 if i else 0.99}}}
        run = track.create_run(name=f"sweep-{i}", home=ui["store"], folder="sweep", hparams=hparams)
        for step in range(10):
            metrics = {"loss": 1 / (step + 1) + lr, "acc": step / 10, "grad_norm": 3.0 - step * 0.2 + i}
            run.log("train", metrics, step=step)
        run.finish()
    return ui


def _visible_headers(p: Checked, kind: str) -> list[str]:
    cells = p.page.locator(f"#runs-table thead th.{kind}")
    return [cells.nth(i).get_attribute("data-col") or "" for i in range(cells.count()) if cells.nth(i).is_visible()]


def test_a_sweep_shows_the_hparams_that_vary_and_each_metrics_last_best_min_and_max(
    browser: Any, sweep: dict[str, Any]
) -> None:
    p = new_page(browser, sweep)
    wait_listed(p, SWEEP, "sweep-2")
    assert _visible_headers(p, "hp") == ["hp:config.opt.beta", "hp:lr"]  # before: amp, accum, batch_size...
    assert _visible_headers(p, "metric") == ["m:train/acc", "m:train/grad_norm", "m:train/loss"]
    row = p.page.locator("#runs-table tbody tr", has_text="sweep-2")
    norm = row.locator("td[data-col='m:train/grad_norm']")
    assert norm.locator(".last").inner_text() == "3.2" and norm.locator(".best").inner_text() == "3.2"
    assert norm.locator(".min").inner_text() == "3.2" and norm.locator(".max").inner_text() == "5"
    assert row.locator("td[data-col='m:train/acc'] .best").inner_text() == "0.9"  # acc: the maximum
    assert "best (min)" in p.page.inner_text("#runs-table th[data-col='m:train/grad_norm']")
    p.page.click("#runs-table th[data-col='hp:config.opt.beta'] a")  # a nested hparam sorts
    p.page.wait_for_load_state("networkidle")
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
    p.page.wait_for_timeout(100)
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
    p.page.click("#filters button[type=submit]")
    p.page.wait_for_load_state("networkidle")
    assert "not understood" in p.page.inner_text("#filter-error")
    assert p.page.input_value("input[name=where]") == "lr>0.05" and p.page.locator("#filters").is_visible()
    p.check("runs-filter-error")
    p.page.fill("input[name=where]", "hp:lrr>0.05")  # a typo in the key: before, 0 runs and no word why
    p.page.click("#filters button[type=submit]")
    p.page.wait_for_load_state("networkidle")
    assert "no run here has the hyper-parameter 'lrr'" in p.page.inner_text("#filter-error")
    p.page.fill("input[name=where]", "hp:config.opt.name=Adam")  # a value no run has: which there are
    p.page.click("#filters button[type=submit]")
    p.page.wait_for_load_state("networkidle")
    assert 'config.opt.name here is one of "adam"' in p.page.inner_text("#filter-error")
    p.page.fill("input[name=where]", "hp:config.opt.beta>0.95")
    p.page.click("#filters button[type=submit]")
    p.page.wait_for_load_state("networkidle")
    assert p.page.locator("a.run-link").all_inner_texts() == ["sweep-0"]
    assert p.page.locator("#filter-error").count() == 0
    p.page.click("#clear")
    p.page.wait_for_load_state("networkidle")
    assert "folder=%2Flocal%2Fsweep" in p.page.url and "where" not in p.page.url
    assert sorted(p.page.locator("a.run-link").all_inner_texts()) == ["sweep-0", "sweep-1", "sweep-2"]
    p.check()
    p.page.context.close()
