"""The console on `ember server`, in Chromium: log in, runs table, filter, run page, chart, lineage,
artifact, compare, log out (issue 9, items 1 and 4); what another user sees (item 2)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from ember.server.services import admin
from ember.server.storage.settings import Settings
from tests.console._data import lineage_graph, make_store, upload
from tests.console.conftest import RESULTS, Checked, new_page
from tests.server.conftest import ServerProcess


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A real server process on SQLite: alice with two private runs, bob with none, eve with hostile names."""
    tmp = tmp_path_factory.mktemp("console")
    settings = Settings.make(data_dir=tmp / "data", db_url=f"sqlite:///{tmp / 'server.db'}")
    keys = {"alice": admin.init(settings, "alice"), "bob": admin.add_user(settings, "bob")}
    keys["eve"] = admin.add_user(settings, "eve")
    proc = ServerProcess(settings.data_dir, settings.db_url).start()
    runs = make_store(tmp / "store")
    upload(runs, proc.url, keys["alice"])
    try:
        yield {"url": proc.url, "keys": keys, "runs": runs, "eve": _hostile_runs(proc.url, keys["eve"])}
    finally:
        proc.kill()


LINK = '<a href="https://evil.example/steal">click</a>'
NAMES = ["<b>eve zero", '<i style="color:red">eve one']  # no '/' in a run name


def _hostile_runs(url: str, key: str) -> dict[str, Any]:
    """Two runs of eve whose run and metric names are Plotly markup, with an output artifact."""
    data = b"model bytes"
    sha = hashlib.sha256(data).hexdigest()
    art = "e" * 32
    with httpx.Client(base_url=f"{url}/api/v1", headers={"Authorization": f"Bearer {key}"}) as http:
        assert http.put(f"/blobs/{sha}", content=data).status_code == 200
        meta = {"id": art, "name": "<b>model", "files": [{"path": "w.bin", "size": len(data), "sha256": sha}]}
        assert (
            http.put(f"/artifacts/{art}", json={"folder": "hostile", "make_folder": True, "artifact": meta}).status_code
            == 200
        )
        ids = []
        for i, name in enumerate(NAMES):
            run_id = f"{i + 1}" * 32
            run = {"id": run_id, "name": name, "status": "Complete", "hparams": {"lr": 0.1 * (i + 1)}}
            assert (
                http.put(f"/runs/{run_id}", json={"folder": "hostile", "make_folder": True, "run": run}).status_code
                == 200
            )
            points = [{"step": s, "time": 1.0, "metrics": {LINK: s * 0.5, "loss": 1.0 / (s + 1)}} for s in range(5)]
            assert (
                http.post(
                    f"/runs/{run_id}/metrics", json={"type": "train", "start": 0, "end": 1, "points": points}
                ).status_code
                == 200
            )
            edge = {
                "time": 1.0,
                "source": {"kind": "run", "id": run_id, "name": name},
                "target": {"kind": "artifact", "id": art, "name": "m"},
            }
            assert http.post(f"/runs/{run_id}/lineage", json={"start": 0, "end": 1, "edges": [edge]}).status_code == 200
            ids.append(run_id)
    return {"runs": ids, "artifact": art}


def login(p: Checked, key: str) -> None:
    p.goto("/ui/")
    assert "/ui/login" in p.page.url
    p.check("login")
    p.page.fill("#api_key", key)
    p.page.click("button[type=submit]")
    p.settle()


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
    p.settle()
    assert p.page.locator("a.run-link").all_inner_texts() == ["tiny-1"]
    p.page.fill("input[name=where]", "")
    p.page.fill("input[name=q]", "tiny-0")
    p.page.click("#filters button[type=submit]")
    p.settle()
    assert p.page.locator("a.run-link").all_inner_texts() == ["tiny-0"]
    p.check("runs-filtered")

    p.page.click("a.run-link")
    p.page.wait_for_selector("#chart-train-loss[data-drawn]")
    p.page.wait_for_selector("#chart-val-acc[data-drawn]")
    p.settle()
    assert p.page.get_attribute("#chart-train-loss", "data-points") == "30"
    assert p.page.get_attribute("#chart-val-acc", "data-points") == "3"
    drawn = p.page.evaluate("document.getElementById('chart-train-loss').uplot.data[0].length")
    assert drawn == 30
    assert "lr" in p.page.inner_text("#hparams") and "step 29 loss" in p.page.inner_text("pre.log")
    p.check("run")
    RESULTS.mkdir(parents=True, exist_ok=True)
    p.page.locator("main").screenshot(path=str(RESULTS / "run-page.png"))
    p.page.check("#log-scale")
    p.page.fill("#smoothing", "0.6")
    p.page.dispatch_event("#smoothing", "input")
    assert p.page.evaluate("document.getElementById('chart-train-loss').uplot.series.length") == 3  # x, raw, smoothed
    assert p.page.evaluate("document.getElementById('chart-train-loss').uplot.scales.y.distr") == 3  # log
    p.page.fill("#log_q", "step 19")
    p.page.click("#log button[type=submit]")
    p.settle()
    assert p.page.inner_text("pre.log").strip() == "step 19 loss 0.6798"
    p.check()

    p.page.click("#lineage a.node-link[data-kind=artifact]")
    p.settle()
    assert "/ui/artifacts/" in p.page.url and "model.pt" in p.page.inner_text("#files")
    p.check("artifact")

    p.goto("/ui/runs")
    for box in p.page.locator("input[name=ids]").all():
        box.check()
    p.page.click("#compare")
    p.page.wait_for_selector("body[data-compare-ready='1'] #compare-grid .chart[data-drawn]")
    p.settle()
    assert p.page.get_attribute("#compare-grid .chart[data-metric='train/loss']", "data-traces") == "2"
    assert "lr" in p.page.locator("#compare-runs thead th.hparam").all_inner_texts()
    p.check("compare")

    p.page.click("#logout")
    p.settle()
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
    assert p.page.request.get(f"{site['url']}/ui/compare/series?type=train&{ids}").status == 404  # the page's series
    assert p.goto(f"/ui/compare?{ids}").status == 404
    p.errors.clear()  # the 404s above are logged by Chromium as failed resources, on purpose
    p.page.context.close()


LOOPBACK = {"127.0.0.1", "localhost", "[::1]", "::1"}


def test_no_request_leaves_the_machine_and_chart_text_is_text(browser: Any, site: dict[str, Any]) -> None:
    """Issue 17, items 8 and 9: every link of every page and every chart button is clicked; no request
    goes to another host (Plotly's "send to cloud", a CDN, a link in a chart title); names show as typed."""
    p = new_page(browser, site["url"], accept_downloads=True)
    outside: list[str] = []
    clicking = {"on": False}

    def route(handle: Any) -> None:
        request = handle.request
        url = request.url
        if not url.startswith(("data:", "blob:", "about:")) and urlsplit(url).hostname not in LOOPBACK:
            outside.append(url)
            handle.abort()
        elif clicking["on"] and request.is_navigation_request() and request.frame == p.page.main_frame:
            handle.fulfill(status=204)  # the click's target is recorded; the page stays for the next click
        else:
            handle.continue_()

    p.page.context.route("**/*", route)
    p.page.context.on("page", lambda popup: outside.append(f"popup {popup.url}"))
    login(p, site["keys"]["eve"])
    eve = site["eve"]
    ids = "&".join(f"ids={i}" for i in eve["runs"])
    pages = [
        "/ui/folders?path=/",
        "/ui/folders?path=/eve/hostile",
        "/ui/runs",
        f"/ui/runs/{eve['runs'][0]}",
        f"/ui/artifacts/{eve['artifact']}",
        f"/ui/compare?{ids}",
        f"/ui/runs/{'0' * 32}",
        "/api/v1/docs",
    ]
    clicked = 0
    for path in pages:
        clicking["on"] = False
        p.goto(path)
        charts = p.page.locator(".chart").count()
        run_page = path.startswith("/ui/runs/")
        uplot = run_page or "compare" in path  # line charts are uPlot's: titles are the page's text
        if charts:
            p.page.wait_for_selector(".chart[data-drawn]" if uplot else ".chart .main-svg")
            if "compare" in path:
                p.page.wait_for_selector("body[data-compare-ready='1']")
            assert p.page.locator(".chart a").count() == 0  # no markup became a link
            titles = p.page.locator(".chart .chart-title" if uplot else ".chart .gtitle").all_text_contents()
            assert any(LINK in t for t in titles), titles
            if "compare" in path:  # the compare page's legend is one list above its grid of charts
                legends = p.page.locator("#compare-legend li").all_inner_texts()
                assert sorted(legends) == sorted(NAMES), legends
        clicking["on"] = True
        plotly = p.page.locator(".chart:has(.modebar)")  # the compare page's sweep charts
        buttons = plotly.locator(".modebar-btn")
        assert buttons.count() >= (4 if plotly.count() else 0)
        for i in range(buttons.count()):
            buttons.nth(i).dispatch_event("click")
            clicked += 1
        links = p.page.locator("a")
        for i in range(links.count()):
            links.nth(i).dispatch_event("click")
            clicked += 1
        p.page.wait_for_timeout(200)
        assert p.page.url.endswith(path) or "/api/v1/docs" in path, (path, p.page.url)
    assert clicked > 40 and not outside, outside
    p.page.context.close()


def test_lineage_depth_walks_the_chain_and_ends_the_cycle(browser: Any, site: dict[str, Any]) -> None:
    """Issue 33, item 9: the run page's depth links draw 1, 2... or every level of lineage each way."""
    with httpx.Client(
        base_url=f"{site['url']}/api/v1", headers={"Authorization": f"Bearer {site['keys']['bob']}"}
    ) as h:
        ids = lineage_graph(lambda method, path, body: h.request(method, path, json=body).status_code)
    p = new_page(browser, site["url"])
    login(p, site["keys"]["bob"])

    def drawn() -> dict[str, int]:
        nodes = p.page.eval_on_selector_all(
            "#lineage a.node-link", "els => els.map(e => [e.dataset.id, Number(e.dataset.level)])"
        )
        return {name: level for name, run_id in ids.items() for i, level in nodes if i == run_id}

    p.goto(f"/ui/runs/{ids['step-3']}")
    assert p.page.get_attribute("#lineage", "data-depth") == "1"
    assert drawn() == {"step-2": -1, "step-5": -1, "step-4": 1, "branch": 1}  # step-5 -> step-3 closes the cycle
    assert p.page.locator("#lineage path.edge").count() == 4
    RESULTS.mkdir(parents=True, exist_ok=True)
    p.page.locator("#lineage").screenshot(path=str(RESULTS / "lineage-depth-1.png"))
    p.page.click("#lineage-depth a[data-depth='2']")
    p.settle()
    assert drawn() == {"step-1": -2, "step-2": -1, "step-5": -1, "step-4": 1, "branch": 1}
    p.goto(f"/ui/runs/{ids['step-1']}")
    p.page.click("#lineage-depth a[data-depth='all']")
    p.settle()
    assert p.page.get_attribute("#lineage", "data-depth") == "all" and "lineage_depth=all" in p.page.url
    assert drawn() == {"step-2": 1, "step-3": 2, "step-4": 3, "branch": 3, "step-5": 4}  # the chain, once
    assert p.page.locator("#lineage path.edge").count() == 6 and p.page.locator("#lineage-more").count() == 0
    assert p.page.locator("#lineage path.edge.back").count() == 1  # step-5 -> step-3, drawn looping back
    assert not p.errors, p.errors
    p.page.locator("#lineage").screenshot(path=str(RESULTS / "lineage-all.png"))
    p.page.click(f"#lineage a.node-link[data-id='{ids['branch']}']")  # walk on from a node: the same depth is asked
    p.settle()
    assert p.page.get_attribute("#lineage", "data-depth") == "1" and drawn()["step-3"] == -1
    response = p.goto(f"/ui/runs/{ids['step-1']}?lineage_depth=deep")
    assert response.status == 422 and "depth" in p.page.inner_text("body")
    p.errors.clear()  # Chromium logs the page's own 422, which is the point here
    p.page.context.close()
