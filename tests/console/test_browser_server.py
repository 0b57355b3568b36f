"""The console on `ember server`, in Chromium: log in, runs table, filter, run page, chart, lineage,
artifact, compare, log out (issue 9, items 1 and 4); what another user sees (item 2)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ember.server import admin
from ember.server.settings import Settings
from tests.console._data import make_store, upload
from tests.console.conftest import RESULTS, Checked, new_page
from tests.server.conftest import ServerProcess


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A real server process on SQLite: alice with two private runs, bob with none."""
    tmp = tmp_path_factory.mktemp("console")
    settings = Settings.make(data_dir=tmp / "data", db_url=f"sqlite:///{tmp / 'server.db'}")
    keys = {"alice": admin.init(settings, "alice"), "bob": admin.add_user(settings, "bob")}
    proc = ServerProcess(settings.data_dir, settings.db_url).start()
    runs = make_store(tmp / "store")
    upload(runs, proc.url, keys["alice"])
    try:
        yield {"url": proc.url, "keys": keys, "runs": runs}
    finally:
        proc.kill()


def login(p: Checked, key: str) -> None:
    p.goto("/ui/")
    assert "/ui/login" in p.page.url
    p.check("login")
    p.page.fill("#api_key", key)
    p.page.click("button[type=submit]")
    p.page.wait_for_load_state("networkidle")


def test_login_browse_filter_run_chart_lineage_compare_logout(browser: Any, site: dict[str, Any]) -> None:
    p = new_page(browser, site["url"])
    login(p, site["keys"]["alice"])
    assert p.page.url.endswith("/ui/folders?path=/alice")
    cookie = next(c for c in p.page.context.cookies() if c["name"] == "ember_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and site["keys"]["alice"] not in cookie["value"]
    p.check("folder")
    p.goto("/ui/folders?path=/alice/examples")
    assert p.page.locator("#sharing").is_visible()  # the owner sees the share settings
    p.check("folder-examples")

    p.goto("/ui/runs")
    assert p.page.locator("#runs-table tbody tr").count() == 2
    p.check("runs")
    p.page.fill("input[name=where]", "hp:lr<0.08")
    p.page.click("#filters button[type=submit]")
    p.page.wait_for_load_state("networkidle")
    assert p.page.locator("a.run-link").all_inner_texts() == ["tiny-1"]
    p.page.fill("input[name=where]", "")
    p.page.fill("input[name=q]", "tiny-0")
    p.page.click("#filters button[type=submit]")
    p.page.wait_for_load_state("networkidle")
    assert p.page.locator("a.run-link").all_inner_texts() == ["tiny-0"]
    p.check("runs-filtered")

    p.page.click("a.run-link")
    p.page.wait_for_selector("#chart-train-loss .main-svg")
    p.page.wait_for_selector("#chart-val-acc .main-svg")
    p.page.wait_for_load_state("networkidle")
    assert p.page.get_attribute("#chart-train-loss", "data-points") == "30"
    assert p.page.get_attribute("#chart-val-acc", "data-points") == "3"
    drawn = p.page.evaluate("document.getElementById('chart-train-loss').data[0].x.length")
    assert drawn == 30
    assert "lr" in p.page.inner_text("#hparams") and "step 29 loss" in p.page.inner_text("pre.log")
    p.check("run")
    RESULTS.mkdir(parents=True, exist_ok=True)
    p.page.locator("main").screenshot(path=str(RESULTS / "run-page.png"))
    p.page.check("#log-scale")
    p.page.fill("#smoothing", "0.6")
    p.page.dispatch_event("#smoothing", "input")
    assert p.page.evaluate("document.getElementById('chart-train-loss').data.length") == 2
    assert p.page.evaluate("document.getElementById('chart-train-loss').layout.yaxis.type") == "log"
    p.page.fill("#log_q", "step 19")
    p.page.click("#log button[type=submit]")
    p.page.wait_for_load_state("networkidle")
    assert p.page.inner_text("pre.log").strip() == "step 19 loss 0.6798"
    p.check()

    p.page.click("#lineage a.node-link[data-kind=artifact]")
    p.page.wait_for_load_state("networkidle")
    assert "/ui/artifacts/" in p.page.url and "model.pt" in p.page.inner_text("#files")
    p.check("artifact")

    p.goto("/ui/runs")
    for box in p.page.locator("input[name=ids]").all():
        box.check()
    p.page.click("#compare")
    p.page.wait_for_selector("#compare-chart .main-svg")
    p.page.wait_for_load_state("networkidle")
    assert p.page.get_attribute("#compare-chart", "data-traces") == "2"
    assert "lr" in p.page.inner_text("#hparam-diff")
    p.check("compare")

    p.page.click("#logout")
    p.page.wait_for_load_state("networkidle")
    assert "/ui/login" in p.page.url
    p.goto("/ui/runs")
    assert "/ui/login" in p.page.url  # the session is gone
    p.page.context.add_cookies([cookie])  # a copy of the cookie taken before logging out
    p.goto("/ui/runs")
    assert "/ui/login" in p.page.url  # is refused: the server ended the session
    p.check()
    p.page.context.close()


def test_bob_sees_no_private_run_anywhere(browser: Any, site: dict[str, Any]) -> None:
    p = new_page(browser, site["url"])
    login(p, site["keys"]["bob"])
    names = [r.name for r in site["runs"]]
    for path in ("/ui/folders?path=/", "/ui/folders?path=/bob", "/ui/runs", "/ui/runs?q=tiny", "/ui/runs?label=tiny"):
        p.goto(path)
        text = p.page.inner_text("body")
        assert not any(n in text for n in names), (path, text[:300])
        p.check()
    for run in site["runs"]:
        response = p.goto(f"/ui/runs/{run.id}")
        assert response.status == 404
        assert "not shared with you" in p.page.inner_text(".error")
        assert run.name not in p.page.inner_text("body")
        p.errors.clear()  # Chromium logs the page's own 404, which is the point here
    p.goto("/ui/folders?path=/alice/examples")
    assert "not shared with you" in p.page.inner_text("body")
    p.errors.clear()
    p.check("forbidden")
    r = p.page.request.get(f"{site['url']}/ui/runs/{site['runs'][0].id}/series?type=train")
    assert r.status == 404
    ids = "&".join(f"ids={r.id}" for r in site["runs"])
    assert p.goto(f"/ui/compare?{ids}").status == 404
    p.errors.clear()  # the 404s above are logged by Chromium as failed resources, on purpose
    p.page.context.close()
