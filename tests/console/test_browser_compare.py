"""The compare page, run images and artifact previews, in Chromium through `ember ui` (issue 19).

Before: one metric at a time chosen in a select, eight colours reused from the ninth run on, no
legend for a single run, no best value marked, nothing for a sweep's hparams; artifact files
downloadable only; no images.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import numpy as np
import pytest
from PIL import Image

from ember import track
from tests.console.conftest import RESULTS, Checked
from tests.console.test_browser_local import new_page, ui  # noqa: F401  (ui: the fixture)

LRS = [10 ** (-1 - i / 4) for i in range(12)]  # 0.1 ... 0.00018: a log-spaced sweep
BIG = 150


GRID = [(opt, lr, seed) for opt in ("adam", "sgd") for lr in (0.1, 0.01) for seed in (0, 1)]
"""Folder ``grid``: two seeds of each optimizer and learning rate."""


def _grid_loss(opt: str, lr: float, seed: int, step: int) -> float:
    return {"adam": 0.0, "sgd": 0.5}[opt] + lr + 0.1 * seed + 1 / (step + 1)


def _sweep_run(store: Path, folder: str, i: int, lr: float, steps: int = 6) -> track.Run:
    opt = "adam" if i % 2 else "sgd"
    hparams = {"lr": lr, "epochs": 2, "opt": {"name": opt, "momentum": 0.9}}
    run = track.create_run(name=f"{folder}-{i:03d}", home=store, folder=folder, hparams=hparams)
    for step in range(steps):
        run.log(
            "train", {"loss": 2.0 / (step + 1) + abs(i - 5) * 0.05, "acc": 0.5 + step * 0.02 + i * 0.001}, step=step
        )
    run.log("val", {"loss": 1.0 + abs(i - 7) * 0.1, "acc": 0.9 - abs(i - 3) * 0.01}, step=steps - 1)
    return run


@pytest.fixture(scope="module")
def site(ui: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:  # noqa: F811
    """12 sweep runs, 150 more in another folder, a run with images and an artifact of every kind of file."""
    store = ui["store"]
    for i, lr in enumerate(LRS):
        _sweep_run(store, "cmp", i, lr).finish()
    for i in range(BIG):
        _sweep_run(store, "big", i, 10 ** (-1 - (i % 40) / 10), steps=3).finish()
    for i, (opt, lr, seed) in enumerate(GRID):
        run = track.create_run(
            name=f"grid-{i}", home=store, folder="grid", hparams={"opt": opt, "lr": lr, "seed": seed}
        )
        for step in range(3):
            run.log("train", {"loss": _grid_loss(opt, lr, seed, step)}, step=step)
        run.finish()
    gan = track.create_run(name="gan", home=store, folder="media")
    gan.log("train", {"loss": 1.0}, step=0)
    for step in (0, 10, 20):
        pixels = np.zeros((16, 24, 3), np.uint8)
        pixels[:, : 8 * (step // 10 + 1)] = (200, 40, 40)  # a red bar that grows with the step
        gan.log_image("samples", pixels, step=step)
    files = tmp_path_factory.mktemp("files")
    saved = np.zeros((20, 30, 3), np.uint8)
    saved[:, :15] = (220, 20, 20)
    Image.fromarray(saved).save(files.parent / "confusion.jpg", quality=95)  # a chart saved as JPEG
    gan.log_image("plots/confusion", files.parent / "confusion.jpg", step=5)
    (files / "bar.png").write_bytes((gan.path / "images/samples/20.png").read_bytes())
    (files / "notes.txt").write_text("first line\n<b>not bold</b>\n")
    (files / "config.json").write_text('{"lr": 0.1, "layers": [1, 2]}')
    (files / "table.csv").write_text("step,loss\n" + "".join(f"{s},{1 / (s + 1):.3f}\n" for s in range(80)))
    (files / "page.html").write_text("<script>alert(1)</script>")
    (files / "logo.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>")
    (files / "trap.png").write_text("<html><script>alert(1)</script></html>")  # named .png, holds HTML
    art = track.create_artifact("media-files", home=store)
    for f in sorted(files.iterdir()):
        art.add_file(f)
    gan.mark_output(art)
    gan.finish()
    return {**ui, "gan": gan, "artifact": art}


def _open_compare(p: Checked, folder: str, count: int, timeout: float = 120.0) -> None:
    """Open the compare page of a folder once `ember ui` has indexed its ``count`` runs and their points
    (it lists every run first and reads the points after: ``#indexing-points`` says so meanwhile).

    The page is asked aside (not in the browser: before two runs are listed it answers 422, which the
    page would record as an error) until it is complete, then opened once.
    """
    deadline = time.monotonic() + timeout
    url = urljoin(p.base, f"/ui/compare?folder=/local/{folder}")

    def indexed() -> bool:
        r = p.page.request.get(url)
        return r.status == 200 and f"Compare {count} runs" in r.text() and 'id="indexing-points"' not in r.text()

    while not indexed() and time.monotonic() < deadline:
        time.sleep(0.5)
    p.goto(f"/ui/compare?folder=/local/{folder}")
    assert f"Compare {count} runs" in p.page.inner_text("h1")
    p.page.wait_for_selector("body[data-compare-ready='1']", timeout=60_000)


def _ids(p: Checked) -> dict[str, str]:
    """Run name -> id, from the compare table's rows."""
    rows = "els => els.map(e => [e.querySelector('td.name a').textContent, e.dataset.run])"
    return dict(p.page.locator("#compare-runs tbody tr").evaluate_all(rows))


def _chart(p: Checked, metric: str) -> Any:
    return p.page.locator(f"#compare-grid .chart[data-metric='{metric}']")


def test_every_shared_metric_in_a_grid_loss_first_distinct_colours_legend_and_best(
    browser: Any, site: dict[str, Any]
) -> None:
    p = new_page(browser, site)
    _open_compare(p, "cmp", 12)
    metrics = p.page.locator("#compare-grid .chart").evaluate_all("els => els.map(e => e.dataset.metric)")
    assert metrics == ["train/loss", "val/loss", "train/acc", "val/acc"]  # every metric, the losses first
    colors = json.loads(_chart(p, "train/loss").get_attribute("data-colors") or "[]")
    assert len(colors) == 12 and len(set(colors)) == 12  # before: run 9 had run 1's colour
    legend = p.page.locator("#compare-legend li")
    assert legend.count() == 12 and legend.first.is_visible()
    swatches = legend.evaluate_all("els => els.map(e => e.querySelector('.swatch').style.background)")
    assert len(set(swatches)) == 12
    names = [f"cmp-{i:03d}" for i in range(12)]
    assert sorted(legend.all_inner_texts()) == names  # newest first, as the runs table
    for metric in ("train/loss", "val/loss", "train/acc", "val/acc"):
        assert _chart(p, metric).get_attribute("data-traces") == "12"
        assert _chart(p, metric).locator("canvas").count() > 0  # uPlot, as the run page
    # best by ember.track.best.metric_mode: the lowest val/loss (run 7), the highest val/acc (run 3)
    ids = _ids(p)
    assert _chart(p, "val/loss").get_attribute("data-best-run") == ids["cmp-007"]
    assert _chart(p, "val/acc").get_attribute("data-best-run") == ids["cmp-003"]
    best_cells = p.page.locator("#compare-runs td.best[data-metric='val/acc']")
    assert best_cells.count() == 1
    assert "cmp-003" in best_cells.locator("xpath=..").inner_text()
    assert (
        p.page.locator("#compare-runs td.best[data-metric='val/loss']")
        .locator("xpath=..")
        .inner_text()
        .startswith("cmp-007")
    )
    headers = p.page.locator("#compare-runs thead th.hparam").all_inner_texts()
    assert headers == ["lr", "opt.name"]  # nested hparams flattened; constants (epochs, opt.momentum) below
    assert "epochs=2" in p.page.inner_text("#runs")
    p.check("compare-grid")
    p.goto("/ui/runs?folder=/local/cmp")  # a sweep is compared whole from its folder, without ticking 12 boxes
    p.page.click("#compare-folder")
    p.page.wait_for_selector("body[data-compare-ready='1']")
    assert "Compare 12 runs" in p.page.inner_text("h1")
    p.page.context.close()


def test_parallel_coordinates_and_scatter_over_a_sweep_of_150_runs(browser: Any, site: dict[str, Any]) -> None:
    p = new_page(browser, site)
    started = time.monotonic()
    _open_compare(p, "big", BIG, timeout=60)
    assert p.page.get_attribute("#parcoords", "data-runs") == str(BIG)
    assert p.page.get_attribute("#scatter", "data-runs") == str(BIG)
    labels = p.page.locator("#parcoords .annotation-text").all_text_contents()
    assert labels[:3] == ["lr (log)", "opt.name", "best train/loss"], (
        labels
    )  # an axis per varying hparam, then the metric
    lines = p.page.locator("#parcoords .scatterlayer .trace").count()
    assert lines >= 2  # the runs' lines (by colour) and the best run's
    assert p.page.locator("#scatter .scatterlayer .point").count() == BIG + 1  # every run and the best starred
    assert _chart(p, "train/loss").get_attribute("data-traces") == str(BIG)  # before: the first 50
    p.page.select_option("#cmp-metric", "val/acc")
    p.page.wait_for_timeout(300)
    ids = _ids(p)
    assert p.page.get_attribute("#scatter", "data-best-run") == ids["big-003"]  # val/acc best: the maximum
    assert "big-003" in p.page.inner_text("#sweep-note")
    p.page.select_option("#cmp-hparam", "opt.name")
    p.page.wait_for_timeout(300)
    ticks = p.page.locator("#scatter .xtick text").all_text_contents()
    assert sorted(ticks) == ["adam", "sgd"]
    p.check("compare-sweep")
    RESULTS.mkdir(parents=True, exist_ok=True)
    p.page.locator("#sweep").screenshot(path=str(RESULTS / "compare-sweep-charts.png"))
    assert time.monotonic() - started < 60
    p.page.context.close()


def test_run_page_shows_images_with_a_step_slider(browser: Any, site: dict[str, Any]) -> None:
    p = new_page(browser, site)
    gan = site["gan"]
    deadline = time.monotonic() + 120  # until `ember ui` has read the run's images (asked aside, so no page 404s)
    listed = f"{site['url'].rstrip('/')}/ui/runs/{gan.id}/images"
    while time.monotonic() < deadline:
        answer = p.page.request.get(listed)
        if answer.status == 200 and len({i["name"] for i in answer.json()["images"]}) == 2:
            break
        p.page.wait_for_timeout(250)
    p.goto(f"/ui/runs/{gan.id}")
    panel = p.page.locator("#images .image-panel[data-name='samples']")
    assert panel.is_visible()
    img = panel.locator("img.image-view")
    assert img.get_attribute("data-step") == "20"  # the newest first
    samples = "#images .image-panel[data-name=samples] img.image-view"
    p.page.wait_for_function(f"() => document.querySelector('{samples}').naturalWidth === 24")
    slider = panel.locator("input.image-step")
    slider.fill("0")
    assert img.get_attribute("data-step") == "0"
    loaded = f"() => {{ const i = document.querySelector('{samples}'); return i.complete && i.naturalWidth; }}"
    p.page.wait_for_function(loaded)
    # the pixels of step 0: the red bar is 8 of 24 columns wide
    red = p.page.evaluate(
        """(sel) => {
          const i = document.querySelector(sel), c = document.createElement('canvas');
          c.width = i.naturalWidth; c.height = i.naturalHeight;
          const g = c.getContext('2d'); g.drawImage(i, 0, 0);
          const d = g.getImageData(0, 8, 24, 1).data;
          let n = 0; for (let x = 0; x < 24; x++) if (d[4 * x] === 200) n++;
          return n;
        }""",
        samples,
    )
    assert red == 8
    assert "0 (24×16)" in panel.inner_text()
    # a JPEG file logged as an image (MLflow's and T9k's habit) is shown as any other, left half red
    saved = p.page.locator("#images .image-panel[data-name='plots/confusion'] img.image-view")
    assert saved.get_attribute("data-step") == "5"
    p.page.wait_for_function(
        "() => { const i = document.querySelector(\"#images .image-panel[data-name='plots/confusion'] img\");"
        " return i && i.complete && i.naturalWidth === 30; }"
    )
    halves = p.page.evaluate(
        """() => {
          const i = document.querySelector("#images .image-panel[data-name='plots/confusion'] img");
          const c = document.createElement('canvas'); c.width = 30; c.height = 20;
          const g = c.getContext('2d'); g.drawImage(i, 0, 0);
          return [g.getImageData(5, 10, 1, 1).data[0], g.getImageData(25, 10, 1, 1).data[0]];
        }"""
    )
    assert halves[0] > 180 and halves[1] < 60, halves  # JPEG is lossy: about 220 and about 0
    p.check("run-images")
    p.page.context.close()


def test_artifact_files_are_previewed_inline_and_never_as_html(browser: Any, site: dict[str, Any]) -> None:
    p = new_page(browser, site)
    art = site["artifact"]
    deadline = time.monotonic() + 20
    p.goto(f"/ui/artifacts/{art.id}")
    while p.page.locator("#previews").count() == 0 and time.monotonic() < deadline:
        p.page.wait_for_timeout(500)
        p.goto(f"/ui/artifacts/{art.id}")
    kinds = {f.get_attribute("data-path"): f.get_attribute("data-kind") for f in p.page.locator("figure.preview").all()}
    assert kinds == {"bar.png": "image", "config.json": "json", "notes.txt": "text", "table.csv": "csv"}
    p.page.wait_for_function("() => document.querySelector('figure[data-path=\"bar.png\"] img').naturalWidth === 24")
    assert "<b>not bold</b>" in p.page.inner_text("figure[data-path='notes.txt'] pre")  # shown as typed
    assert p.page.locator("figure b").count() == 0
    assert '"layers": [\n    1,' in p.page.inner_text("figure[data-path='config.json'] pre")  # pretty-printed
    csv = p.page.locator("figure[data-path='table.csv'] table")
    assert csv.locator("th").all_inner_texts() == ["step", "loss"] and csv.locator("tr").count() == 51  # the head
    skipped = p.page.locator(".not-previewed").evaluate_all("els => els.map(e => e.dataset.path)")
    assert sorted(skipped) == ["logo.svg", "page.html"]  # never inline; trap.png (HTML inside) is not an image
    base = f"/ui/artifacts/{art.id}/preview"
    png = p.page.request.get(site["url"] + f"{base}/bar.png")
    assert png.status == 200 and png.headers["content-type"] == "image/png"
    assert png.headers["x-content-type-options"] == "nosniff" and "sandbox" in png.headers["content-security-policy"]
    for name in ("trap.png", "page.html", "logo.svg"):
        assert p.page.request.get(site["url"] + f"{base}/{name}").status == 415, name
    # issue 33, item 10: filed beside the run that wrote it (gan, in media), not in /local/default
    assert p.page.locator("dt:text('Folder') + dd").inner_text() == "/local/media"
    assert p.page.locator("nav.crumbs").inner_text().split() == ["/", "local", "/", "media"]
    p.check("artifact-previews")
    p.goto("/ui/folders?path=/local/media")
    assert p.page.locator("ul.folders a", has_text="media-files").count() == 1
    p.page.context.close()


def test_every_run_tying_for_the_best_value_is_starred_and_highlighted(browser: Any, site: dict[str, Any]) -> None:
    """Before: only the first of two runs with the same best loss was starred and highlighted."""
    for name, losses in (("tie-a", [0.9, 0.4]), ("tie-b", [0.4, 0.7]), ("tie-c", [0.8, 0.6])):
        run = track.create_run(name=name, home=site["store"], folder="tie")
        for step, loss in enumerate(losses):
            run.log("val", {"loss": loss}, step=step)
        run.finish()
    p = new_page(browser, site)
    _open_compare(p, "tie", 3)
    ids = _ids(p)
    starred = (_chart(p, "val/loss").get_attribute("data-best-run") or "").split()
    assert sorted(starred) == sorted([ids["tie-a"], ids["tie-b"]])
    cells = p.page.locator("#compare-runs td.best[data-metric='val/loss']").locator("xpath=..")
    assert sorted(row.split()[0] for row in cells.all_inner_texts()) == ["tie-a", "tie-b"]
    p.check("compare-ties")


# The colours a chart's lines are drawn in, as the browser writes a CSS colour (rgb(...)), to compare with the legend's.
LINE_COLOURS = """el => JSON.parse(el.dataset.colors).map(c => { const s = document.createElement('span').style;
  s.background = c; return s.background; })"""


def test_the_legend_is_shown_for_two_runs_and_names_each_in_its_line_colour(browser: Any, site: dict[str, Any]) -> None:
    """Two runs, the fewest the page compares: the legend is shown, one entry a run, in its lines' colour.

    Before: plotly's legend under the one chart, which plotly leaves out of a chart of a single line.
    """
    count, folder = 2, "legend2"
    for i in range(count):
        _sweep_run(site["store"], folder, i, LRS[i]).finish()
    p = new_page(browser, site)
    _open_compare(p, folder, count)
    legend = p.page.locator("#compare-legend li")
    assert legend.count() == count
    assert all(legend.nth(i).is_visible() for i in range(count))
    names = [f"{folder}-{i:03d}" for i in reversed(range(count))]  # newest first, as the runs table
    assert legend.all_inner_texts() == names == list(_ids(p))
    swatches = legend.evaluate_all("els => els.map(e => e.querySelector('.swatch').style.background)")
    for metric in ("train/loss", "val/loss", "train/acc", "val/acc"):
        assert _chart(p, metric).get_attribute("data-traces") == str(count)
        assert _chart(p, metric).evaluate(LINE_COLOURS) == swatches
    p.check("compare-legend-2")
    p.page.context.close()


SIXTY = 60


def test_sixty_runs_every_run_drawn_and_the_best_over_all_of_them_named_and_starred(
    browser: Any, site: dict[str, Any]
) -> None:
    """Before: line charts drew the newest 50 runs and named and starred the best of those 50
    ("best 0.9611 · sweep-49") while the table highlighted an older run absent from the charts."""
    for i in range(SIXTY):  # the oldest, sixty-004, holds the best val/acc; newest first, it is 56th
        run = track.create_run(name=f"sixty-{i:03d}", home=site["store"], folder="sixty", hparams={"seed": i})
        for step in range(4):
            run.log("val", {"acc": 0.5 + 0.1 * step + (0.09 if i == 4 else i * 0.001)}, step=step)
        run.finish()
    p = new_page(browser, site)
    _open_compare(p, "sixty", SIXTY)
    ids = _ids(p)
    chart = _chart(p, "val/acc")
    assert chart.get_attribute("data-traces") == str(SIXTY)
    assert chart.get_attribute("data-best-run") == ids["sixty-004"]
    assert chart.get_attribute("data-stars") == ids["sixty-004"]  # starred on its line
    assert chart.locator(".chart-best").inner_text() == "best 0.89 · sixty-004"
    cell = p.page.locator("#compare-runs td.best[data-metric='val/acc']").locator("xpath=..")
    assert cell.get_attribute("data-run") == ids["sixty-004"]  # the table and the chart agree
    # the title stands above the plot, never under a toolbar: the two boxes do not overlap
    title = chart.locator(".chart-head").bounding_box()
    plot = chart.locator(".chart-plot").bounding_box()
    assert title and plot and title["y"] + title["height"] <= plot["y"] + 0.5
    # hovering the star names the run, its value and step
    chart.scroll_into_view_if_needed()
    star = chart.evaluate(
        """el => { const u = el.uplot; const s = u.series.findIndex(s => s.label === 'sixty-004');
        const i = u.data[s].findIndex(v => v !== undefined && Math.abs(v - 0.89) < 1e-9);
        const r = u.over.getBoundingClientRect();
        return [r.left + u.valToPos(u.data[0][i], 'x'), r.top + u.valToPos(u.data[s][i], 'y')]; }"""
    )
    p.page.mouse.move(star[0] - 30, star[1])
    p.page.mouse.move(star[0] - 1.5, star[1], steps=3)  # the last step: the plot's right edge
    assert chart.locator(".chart-hover").inner_text() == "best (max): sixty-004 · 0.89 at step 3"
    # the legend filters: a click hides the run in every chart, a second shows it again
    entry = p.page.locator("#compare-legend li", has_text="sixty-004")
    shown = "(el, name) => el.uplot.series.find(s => s.label === name).show"
    entry.click()
    assert chart.evaluate(shown, "sixty-004") is False
    assert "off" in (entry.get_attribute("class") or "") and p.page.inner_text("#legend-count") == str(SIXTY - 1)
    entry.click()
    assert chart.evaluate(shown, "sixty-004") is True
    p.check("compare-sixty")
    RESULTS.mkdir(parents=True, exist_ok=True)
    p.page.screenshot(path=str(RESULTS / "compare-60-runs.png"), full_page=True)
    p.page.context.close()


def test_runs_grouped_by_an_hparam_are_bands_with_counts_kept_in_the_url(browser: Any, site: dict[str, Any]) -> None:
    """Issue 33 item 6: seeds (here the runs of each optimizer) folded into one mean ± std band per
    value of the chosen hparam, the count of runs in the legend, the choice kept in the URL."""
    p = new_page(browser, site)
    _open_compare(p, "cmp", 12)
    p.page.select_option("#cmp-group", "opt.name")
    p.page.wait_for_function(
        "document.querySelector(\"#compare-grid .chart[data-metric='train/loss']\").dataset.groups"
    )
    assert "group=opt.name" in p.page.url
    legend = p.page.locator("#compare-legend li").all_inner_texts()
    assert legend == ["opt.name=adam (6 runs)", "opt.name=sgd (6 runs)"]  # the newest run's group first
    chart = _chart(p, "train/loss")
    assert json.loads(chart.get_attribute("data-groups") or "[]") == [["opt.name=adam", 6], ["opt.name=sgd", 6]]
    # the band of adam (runs 1, 3, ... 11) at step 0: the mean and std of its runs' train/loss there
    losses = [2.0 + abs(i - 5) * 0.05 for i in range(1, 12, 2)]
    mean = sum(losses) / 6
    std = (sum((v - mean) ** 2 for v in losses) / 6) ** 0.5
    got = chart.evaluate(
        "el => { const u = el.uplot, j = u.data[0].indexOf(0); return [1, 2, 3].map(k => u.data[k][j]); }"
    )
    assert got == pytest.approx([mean, mean + std, mean - std], rel=1e-9)
    assert chart.evaluate("el => el.uplot.bands.length") == 2
    p.page.locator("#compare-legend li").first.click()  # the legend filters groups too
    p.page.wait_for_function(
        "!document.querySelector(\"#compare-grid .chart[data-metric='train/loss']\").uplot.series[1].show"
    )
    p.page.reload()  # the grouping survives a reload: it is in the address
    p.page.wait_for_selector("body[data-compare-ready='1']")
    assert p.page.locator("#cmp-group-keys button").all_inner_texts() == ["opt.name ×"]
    assert p.page.locator("#compare-legend li").count() == 2
    p.check("compare-grouped")
    RESULTS.mkdir(parents=True, exist_ok=True)
    p.page.locator("#metrics").screenshot(path=str(RESULTS / "compare-grouped.png"))
    p.page.context.close()


def test_smoothing_draws_the_raw_line_beneath_log_spares_accuracy_and_settings_stay_in_the_url(
    browser: Any, site: dict[str, Any]
) -> None:
    """Issue 33, item 8: smoothed, the compare page drew only the smoothed lines; its log scale put
    accuracy on a log axis; a reload forgot smoothing, x axis, log boxes, hidden runs and the sweep's choices."""
    p = new_page(browser, site)
    _open_compare(p, "cmp", 12)
    ids = _ids(p)
    p.page.locator("#cmp-smoothing").evaluate(
        "el => { el.value = '0.9'; el.dispatchEvent(new Event('input', {bubbles: true})); }"
    )
    loss = _chart(p, "train/loss")
    p.page.wait_for_function(
        "document.querySelector(\"#compare-grid .chart[data-metric='train/loss']\").uplot.data[1][1] > 1.4"
    )
    # cmp-005's raw line between steps 1 and 2 (1.0 -> 0.667; the smoothed lines are above 1.3 there):
    # drawn faint in its colour, where before the canvas was white or a grey grid line
    tint = loss.evaluate(
        """el => { const u = el.uplot, x = Math.round(u.valToPos(1.25, 'x', true));
                   const y = Math.round(u.valToPos(1 - 0.25 / 3, 'y', true));
                   const px = u.ctx.getImageData(x - 2, y - 2, 5, 5).data;
                   let most = 0;
                   for (let i = 0; i < px.length; i += 4) {
                     const c = [px[i], px[i + 1], px[i + 2]];
                     most = Math.max(most, Math.max(...c) - Math.min(...c));
                   }
                   return most; }"""
    )
    assert tint > 8, tint  # a colour, not white or grey
    loss.scroll_into_view_if_needed()
    star = loss.evaluate(  # the best point as recorded (2/6 at step 5), not the smoothed value there
        """el => { const u = el.uplot, r = u.over.getBoundingClientRect();
        return [r.left + u.valToPos(5, 'x'), r.top + u.valToPos(2 / 6, 'y')]; }"""
    )
    p.page.mouse.move(star[0] - 30, star[1])
    p.page.mouse.move(star[0] - 1.5, star[1], steps=3)
    assert loss.locator(".chart-hover").inner_text() == "best (min): cmp-005 · 0.3333 at step 5"
    p.page.check("#cmp-log")  # the page's log scale: the losses, never an accuracy
    p.page.wait_for_function(
        "document.querySelector(\"#compare-grid .chart[data-metric='train/loss']\").uplot.scales.y.distr === 3"
    )
    distr = "el => el.uplot.scales.y.distr"
    assert _chart(p, "train/acc").evaluate(distr) == 1 and _chart(p, "val/acc").evaluate(distr) == 1
    _chart(p, "val/acc").locator("input.chart-log").check()
    RESULTS.mkdir(parents=True, exist_ok=True)
    p.page.locator("#metrics").screenshot(path=str(RESULTS / "compare-smoothed-raw-beneath.png"))
    p.page.locator("#compare-legend li", has_text="cmp-004").click()
    p.page.select_option("#cmp-x", "relative")
    p.page.select_option("#cmp-value", "last")
    url = p.page.url
    assert "smoothing=0.9" in url and "log=1" in url and "chart_log=val%2Facc" in url and "x=relative" in url
    assert f"hide={ids['cmp-004']}" in url and "value=last" in url
    p.page.goto(url)  # a shared link (or a reload) shows the same page
    p.page.wait_for_selector("body[data-compare-ready='1']")
    assert p.page.input_value("#cmp-smoothing") == "0.9" and p.page.is_checked("#cmp-log")
    assert p.page.input_value("#cmp-x") == "relative" and p.page.input_value("#cmp-value") == "last"
    assert _chart(p, "val/acc").evaluate(distr) == 3 and _chart(p, "train/acc").evaluate(distr) == 1
    assert _chart(p, "val/acc").locator("input.chart-log").is_checked()
    shown = "(el, name) => el.uplot.series.find(s => s.label === name).show"
    assert _chart(p, "train/loss").evaluate(shown, "cmp-004") is False
    assert "off" in (p.page.locator("#compare-legend li", has_text="cmp-004").get_attribute("class") or "")
    assert p.page.inner_text("#legend-count") == "11"
    p.check("compare-settings-in-url")
    p.page.context.close()


def test_grouped_by_several_keys_on_the_compare_page_and_the_runs_table(browser: Any, site: dict[str, Any]) -> None:
    """Issue 33 item 6: ``group=opt,lr`` is one group per combination on the compare page (keys added
    and taken away, kept in the URL) and on the runs table (a row per group with its count and the
    mean ± std of each metric column, its runs beneath on a click)."""
    p = new_page(browser, site)
    _open_compare(p, "grid", len(GRID))
    groups = "document.querySelector(\"#compare-grid .chart[data-metric='train/loss']\").dataset.groups"
    p.page.select_option("#cmp-group", "opt")
    p.page.wait_for_function(groups)
    p.page.select_option("#cmp-group", "lr")  # a second key: one group per (opt, lr)
    p.page.wait_for_function(f"({groups} || '').split('lr=').length === 5")
    assert "group=opt%2Clr" in p.page.url
    assert p.page.locator("#cmp-group-keys button").all_inner_texts() == ["opt ×", "lr ×"]
    legend = sorted(p.page.locator("#compare-legend li").all_inner_texts())
    assert legend == [f"opt={o} · lr={lr} (2 runs)" for o in ("adam", "sgd") for lr in (0.01, 0.1)]
    chart = _chart(p, "train/loss")
    assert chart.evaluate("el => el.uplot.bands.length") == 4
    p.check()
    RESULTS.mkdir(parents=True, exist_ok=True)
    p.page.locator("#metrics").screenshot(path=str(RESULTS / "compare-grouped-two-keys.png"))
    p.page.click("#cmp-group-keys button[data-key='opt']")  # take a key away: by lr alone
    p.page.wait_for_function(f"({groups} || '').split('lr=').length === 3")
    assert sorted(p.page.locator("#compare-legend li").all_inner_texts()) == ["lr=0.01 (4 runs)", "lr=0.1 (4 runs)"]
    assert "group=lr" in p.page.url

    # the runs table: grouped by the same keys from its form, kept in the URL and its sort links
    p.goto("/ui/runs?folder=/local/grid")
    p.page.fill("input[name=group]", "opt,lr")
    p.page.click("#filters button[type=submit]")
    p.settle()
    assert "group=opt%2Clr" in p.page.url
    rows = p.page.locator("#runs-table tr.group-row")
    assert sorted(rows.evaluate_all("els => els.map(e => [e.dataset.label, e.dataset.runs])")) == [
        [f"opt={o} · lr={lr}", "2"] for o in ("adam", "sgd") for lr in (0.01, 0.1)
    ]
    assert p.page.locator("#runs-table tr.group-member:visible").count() == 0  # folded until clicked
    assert "8 runs in 4 groups by opt,lr" in p.page.inner_text("#group-note")
    cell = p.page.locator(
        "#runs-table tr.group-row[data-label='opt=sgd · lr=0.1'] td.group-stat[data-col='m:train/loss']"
    )
    lasts = [_grid_loss("sgd", 0.1, seed, 2) for seed in (0, 1)]
    mean = sum(lasts) / 2
    assert float(cell.get_attribute("data-last-mean") or "nan") == pytest.approx(mean, rel=1e-12)
    assert float(cell.get_attribute("data-last-std") or "nan") == pytest.approx(0.05, rel=1e-9)
    assert cell.get_attribute("data-n") == "2" and "±" in cell.inner_text()
    p.page.click("#runs-table tr.group-row[data-label='opt=sgd · lr=0.1'] button.group-toggle")
    members = p.page.locator("#runs-table tr.group-member:visible a.run-link").all_inner_texts()
    assert sorted(members) == ["grid-4", "grid-5"]
    assert all("group=opt%2Clr" in h or "group=opt,lr" in h for h in p.page.eval_on_selector_all(
        "#runs-table thead a.sort", "els => els.map(e => e.href)"))  # fmt: skip
    p.check()
    p.page.locator("main").screenshot(path=str(RESULTS / "runs-grouped.png"))
    p.goto("/ui/runs?folder=/local/grid&group=nope")  # a key no run has: said, the table not grouped
    assert "no run here has the hyper-parameter 'nope'" in p.page.inner_text("#filter-error")
    assert p.page.locator("#runs-table tr.group-row").count() == 0 and p.page.locator("a.run-link").count() == 8
    p.page.context.close()
