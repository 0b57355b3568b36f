"""Runs you can edit, in Chromium (issue 33, item 5): rename, labels and notes on the run page, the
server's edit kept over the next upload, bulk labels and the trash from the runs table, the trash
page (restore, delete now), and a view-only user who gets no form and a 403 for a forged one.
Images at full size (item 7): the lightbox with its step slider, and one image name side by side
across the runs compared. One server process for all of them."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from ember import track
from ember.server.services import admin
from ember.server.storage.settings import Settings
from ember.track.cli import main
from ember.track.client import Client, UploadError, upload_run
from tests.console.conftest import RESULTS, Checked, new_page
from tests.server.conftest import ServerProcess


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A real server process on SQLite with alice (owner) and bob (view on alice's folder ``edits``)."""
    tmp = tmp_path_factory.mktemp("edits")
    settings = Settings.make(data_dir=tmp / "data", db_url=f"sqlite:///{tmp / 'server.db'}")
    keys = {"alice": admin.init(settings, "alice"), "bob": admin.add_user(settings, "bob")}
    proc = ServerProcess(settings.data_dir, settings.db_url).start()
    try:
        yield {"url": proc.url, "keys": keys}
    finally:
        proc.kill()


def _api(site: dict[str, Any], user: str = "alice") -> httpx.Client:
    return httpx.Client(base_url=f"{site['url']}/api/v1", headers={"Authorization": f"Bearer {site['keys'][user]}"})


def _put_run(http: httpx.Client, run_id: str, name: str, labels: list[str]) -> None:
    run = {"id": run_id, "name": name, "status": "Complete", "labels": labels, "hparams": {"lr": 0.1}}
    body = {"folder": "edits", "make_folder": True, "run": run}
    assert http.put(f"/runs/{run_id}", json=body).status_code == 200


def _settle(p: Checked) -> None:
    """A run or compare page fetches its images after load: wait until they are in, so that leaving
    the page aborts no request (which :class:`Checked` would record as an error)."""
    if "/ui/runs/" in p.page.url or "/ui/compare" in p.page.url:
        p.settle()


def _go(p: Checked, path: str) -> None:
    """Open a page: its load event, and its fetches where it makes some (:func:`_settle`)."""
    p.page.goto(f"{p.base}{path}", wait_until="load")
    _settle(p)


def _submit(p: Checked, selector: str) -> None:
    with p.page.expect_navigation(wait_until="load"):
        p.page.click(selector)
    _settle(p)


def login(p: Checked, key: str) -> None:
    _go(p, "/ui/login")
    p.page.fill("#api_key", key)
    _submit(p, "button[type=submit]")


def _labels(p: Checked) -> dict[str, list[str]]:
    rows = p.page.locator("#runs-table tbody tr").all()
    return {r.locator("a.run-link").inner_text(): r.locator("td .label").all_inner_texts() for r in rows}


def test_rename_label_note_bulk_and_trash(browser: Any, site: dict[str, Any]) -> None:
    ids = {name: (str(i + 1) * 32) for i, name in enumerate(("e1", "e2", "e3"))}
    with _api(site) as http:
        for name, run_id in ids.items():
            _put_run(http, run_id, name, ["local"])
        share = {"kind": "folder", "target": "/alice/edits", "grantee": "bob", "level": "view"}
        assert http.put("/shares", json=share).status_code == 200
    p = new_page(browser, site["url"])
    login(p, site["keys"]["alice"])

    # the run page: rename, labels, notes
    _go(p, f"/ui/runs/{ids['e1']}")
    p.page.click("#run-edit summary")
    p.page.fill("#edit-name", "e1-baseline")
    p.page.fill("#edit-labels", "keep, best ,keep")
    p.page.fill("#edit-description", "the one to beat: <b>not markup</b>")
    _submit(p, "#edit-save")
    assert p.page.inner_text("h1") == "e1-baseline"
    assert p.page.locator(".title-row .label").all_inner_texts() == ["keep", "best"]
    assert p.page.inner_text("#run-description") == "the one to beat: <b>not markup</b>"
    p.page.click("#run-edit summary")  # open, for the screenshot
    p.check("run-edit")  # no console error, every link answers, a screenshot
    # the next upload of the run (its local name and labels) does not undo the edit
    with _api(site) as http:
        _put_run(http, ids["e1"], "e1", ["local"])
    _go(p, f"/ui/runs/{ids['e1']}")
    assert p.page.inner_text("h1") == "e1-baseline" and "keep" in p.page.inner_text(".title-row")

    # the runs table: a label added to the ticked runs, removed from one, nothing ticked said inline
    _go(p, "/ui/runs?folder=/alice/edits")
    p.page.click("#bulk [data-bulk=trash]")
    assert p.page.inner_text("#bulk-note") == "Tick the runs first."
    p.page.check(f"input[name=ids][value='{ids['e2']}']")
    p.page.check(f"input[name=ids][value='{ids['e3']}']")
    p.page.click("#bulk [data-bulk=label]")
    assert p.page.inner_text("#bulk-note") == "Type the label first."
    p.page.fill("#bulk-label", "sweep")
    _submit(p, "#bulk [data-bulk=label]")
    assert "folder=%2Falice%2Fedits" in p.page.url or "folder=/alice/edits" in p.page.url  # back where it was
    assert _labels(p) == {"e1-baseline": ["keep", "best"], "e2": ["local", "sweep"], "e3": ["local", "sweep"]}
    p.page.check(f"input[name=ids][value='{ids['e3']}']")
    p.page.fill("#bulk-label", "local")
    _submit(p, "#bulk [data-bulk=unlabel]")
    assert _labels(p)["e3"] == ["sweep"]
    p.check("runs-table-bulk")
    p.page.check(f"input[name=ids][value='{ids['e2']}']")
    _submit(p, "#bulk [data-bulk=trash]")
    assert sorted(_labels(p)) == ["e1-baseline", "e3"]

    # the run page's trash, the trash page: restore one, delete the other now
    _go(p, f"/ui/runs/{ids['e3']}")
    p.page.click("#run-edit summary")
    _submit(p, "#run-trash")
    assert p.page.url.endswith("/ui/trash")
    assert sorted(p.page.locator("#trash tbody td:first-child").all_inner_texts()) == ["e2", "e3"]
    p.page.screenshot(path=str(RESULTS / "trash.png"), full_page=True)
    _submit(p, f"#trash tr[data-id='{ids['e3']}'] button.restore")
    assert p.page.url.endswith(f"/ui/runs/{ids['e3']}") and p.page.inner_text("h1") == "e3"
    _go(p, "/ui/trash")
    _submit(p, f"#trash tr[data-id='{ids['e2']}'] button.purge")
    assert p.page.inner_text("#trash tbody") == "The trash is empty."
    with _api(site) as http:
        assert http.get(f"/runs/{ids['e2']}").status_code == 404
        assert http.post(f"/runs/{ids['e2']}/restore").status_code == 404  # gone for good
    # a form without its CSRF token is refused
    r = p.page.request.post(f"{site['url']}/ui/runs/{ids['e3']}/trash", form={"csrf": "forged"})
    assert r.status == 403
    assert not p.errors, p.errors
    p.page.context.close()

    # bob may view alice's folder, not change it: no form, and a forged one with his own token is a 403
    b = new_page(browser, site["url"])
    login(b, site["keys"]["bob"])
    _go(b, f"/ui/runs/{ids['e1']}")
    assert b.page.inner_text("h1") == "e1-baseline" and b.page.locator("#run-edit").count() == 0
    token = b.page.get_attribute("header form input[name=csrf]", "value")
    for path, form in [
        (f"/ui/runs/{ids['e1']}/edit", {"name": "bob-was-here", "csrf": token}),
        (f"/ui/runs/{ids['e1']}/trash", {"csrf": token}),
        ("/ui/runs-bulk", {"action": "trash", "ids": ids["e3"], "csrf": token}),
    ]:
        r = b.page.request.post(f"{site['url']}{path}", form=form)
        assert r.status == 403, (path, r.status, r.text()[:200])
    _go(b, f"/ui/runs/{ids['e1']}")
    assert b.page.inner_text("h1") == "e1-baseline"
    assert not b.errors, b.errors
    b.page.context.close()


def test_cli_twins_edit_the_local_run_and_the_server(
    site: dict[str, Any], tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ember runs label/rename/note --server`` change run.json and the same run on the server; a field
    edited on the server keeps the server's value over the next upload, the others follow the upload."""
    monkeypatch.setenv("EMBER_HOME", str(tmp_path / "store"))
    monkeypatch.setenv("EMBER_HOST", site["url"])
    monkeypatch.setenv("EMBER_API_KEY", site["keys"]["alice"])
    run = track.create_run(name="cli-run", labels=["first"])
    run.finish()
    assert run.path is not None
    with Client() as client:
        upload_run(run.path, "cli", True, "new", client)
        assert main(["runs", "label", "cli-run", "--add", "keep", "--server"]) == 0
        assert main(["runs", "note", "cli-run", "checked by hand", "--server"]) == 0
        assert main(["runs", "rename", "cli-run", "cli-renamed"]) == 0  # local only: the upload sends it
        upload_run(run.path, "cli", True, "new", client)
        shown = client.call("GET", f"/runs/{run.id}")
        assert (shown["name"], shown["labels"], shown["description"]) == (
            "cli-renamed",
            ["first", "keep"],
            "checked by hand",
        )
        client.call("PATCH", f"/runs/{run.id}", json={"labels": ["server-side"]})
        assert main(["runs", "label", "cli-run", "--remove", "first"]) == 0  # the folder keeps its name
        upload_run(run.path, "cli", True, "new", client)
        assert client.call("GET", f"/runs/{run.id}")["labels"] == ["server-side"]  # the server's edit wins
    assert "on " + site["url"] in capsys.readouterr().out


def test_cli_rm_server_moves_the_run_to_the_trash_or_purges_it_and_a_refusal_keeps_the_folder(
    site: dict[str, Any], tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ember runs rm --server`` removes the folder and the same run on the server: to its trash
    (restorable), or deleted with ``--purge``; a refusal there (no such run, a bad key) keeps the folder."""
    monkeypatch.setenv("EMBER_HOME", str(tmp_path / "store"))
    monkeypatch.setenv("EMBER_HOST", site["url"])
    monkeypatch.setenv("EMBER_API_KEY", site["keys"]["alice"])
    made = {}
    for name in ("rm-trash", "rm-purge", "rm-local-only"):
        made[name] = track.create_run(name=name)
        made[name].finish()
    paths = {name: run.path for name, run in made.items()}
    with Client() as client:
        for name in ("rm-trash", "rm-purge"):
            upload_run(paths[name], "cli-rm", True, "new", client)
        capsys.readouterr()
        assert main(["runs", "rm", "rm-local-only", "--yes", "--server"]) == 2  # never uploaded: 404 there
        err = capsys.readouterr().err
        assert "404" in err and "kept here" in err, err
        assert main(["runs", "rm", "rm-trash", "--yes", "--purge"]) == 2  # --purge is for the server's copy
        assert "add --server" in capsys.readouterr().err
        monkeypatch.setenv("EMBER_API_KEY", "not-a-key")
        assert main(["runs", "rm", "rm-trash", "--yes", "--server"]) == 2
        assert "401" in capsys.readouterr().err
        assert all(p is not None and p.is_dir() for p in paths.values()), "a refused rm removed a folder"
        monkeypatch.setenv("EMBER_API_KEY", site["keys"]["alice"])

        assert main(["runs", "rm", "rm-trash", "--yes", "--server"]) == 0
        assert f"to the trash on {site['url']}" in capsys.readouterr().out
        assert not paths["rm-trash"].exists()
        assert made["rm-trash"].id in [r["id"] for r in client.call("GET", "/trash")["runs"]]
        client.call("POST", f"/runs/{made['rm-trash'].id}/restore")  # restorable
        assert client.call("GET", f"/runs/{made['rm-trash'].id}")["name"] == "rm-trash"

        assert main(["runs", "rm", "rm-purge", "--yes", "--server", "--purge"]) == 0
        assert f"deleted run {made['rm-purge'].id} on {site['url']}" in capsys.readouterr().out
        assert not paths["rm-purge"].exists()
        assert made["rm-purge"].id not in [r["id"] for r in client.call("GET", "/trash")["runs"]]
        with pytest.raises(UploadError, match="404"):
            client.call("GET", f"/runs/{made['rm-purge'].id}")


def _png(width: int, height: int, red_columns: int) -> str:
    """A PNG, base64: black with its first ``red_columns`` columns red."""
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[:, :red_columns] = (200, 40, 40)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


_RED_COLUMNS = """(sel) => {
  const i = document.querySelector(sel), c = document.createElement('canvas');
  c.width = i.naturalWidth; c.height = i.naturalHeight;
  const g = c.getContext('2d'); g.drawImage(i, 0, 0);
  const d = g.getImageData(0, 1, c.width, 1).data;
  let n = 0; for (let x = 0; x < c.width; x++) if (d[4 * x] === 200) n++;
  return [c.width, n, i.getBoundingClientRect().width];
}"""


def test_images_open_at_full_resolution_and_side_by_side_on_compare(browser: Any, site: dict[str, Any]) -> None:
    """Issue 33, item 7: the run page's image opens in a lightbox at its own 900 px, whose slider moves
    through the steps; the compare page shows one image name for every run that logged it, at one step
    (a run's last image before it where it has none there)."""
    runs = {"img-a": "a" * 32, "img-b": "b" * 32}
    steps = {"img-a": (0, 10, 20), "img-b": (0, 15)}
    with _api(site) as http:
        for name, run_id in runs.items():
            _put_run(http, run_id, name, [])
            lines = [
                {"name": "samples", "step": s, "time": 1.0, "png": _png(900, 40, 100 + 10 * s)} for s in steps[name]
            ]
            answer = http.post(f"/runs/{run_id}/images", json={"start": 0, "end": 100, "images": lines})
            assert answer.status_code == 200, answer.text
    p = new_page(browser, site["url"])
    login(p, site["keys"]["alice"])
    _go(p, f"/ui/runs/{runs['img-a']}")
    shown = "#images .image-panel[data-name=samples] img.image-view"
    p.page.wait_for_function(
        f"() => document.querySelector('{shown}') && document.querySelector('{shown}').naturalWidth"
    )
    assert p.page.evaluate(_RED_COLUMNS, shown)[2] < 900  # scaled down in its panel
    p.page.click(shown)
    full = "#lightbox img.lightbox-image"
    p.page.wait_for_function(
        f"() => document.querySelector('{full}').complete && document.querySelector('{full}').naturalWidth"
    )
    assert p.page.evaluate(_RED_COLUMNS, full) == [900, 300, 900]  # step 20, at its own size
    p.page.locator("#lightbox input.lightbox-step").fill("1")
    assert p.page.get_attribute(full, "data-step") == "10"
    p.page.wait_for_function(
        f"() => document.querySelector('{full}').complete && document.querySelector('{full}').naturalWidth"
    )
    assert p.page.evaluate(_RED_COLUMNS, full)[:2] == [900, 200]
    assert "10 (900×40)" in p.page.inner_text("#lightbox")
    p.page.screenshot(path=str(RESULTS / "image-lightbox.png"))
    p.page.keyboard.press("Escape")
    assert not p.page.evaluate("document.getElementById('lightbox').open")

    _go(p, f"/ui/compare?ids={runs['img-a']}&ids={runs['img-b']}")
    p.page.wait_for_selector("#compare-images[data-ready='1']")
    cells = "#compare-images .cmp-image-name[data-name=samples] figure"
    assert p.page.locator(cells).count() == 2
    at = lambda run: p.page.get_attribute(f"{cells}[data-run='{runs[run]}'] img", "data-step")  # noqa: E731
    assert (at("img-a"), at("img-b")) == ("20", "15")  # the newest step of all; b's last before it
    p.page.locator("#compare-images input.cmp-image-step").fill("2")  # steps 0, 10, 15, 20: step 15
    assert (at("img-a"), at("img-b")) == ("10", "15")
    p.page.locator("#compare-images input.cmp-image-step").fill("0")
    assert (at("img-a"), at("img-b")) == ("0", "0")
    p.page.locator("#compare-images input.cmp-image-step").fill("3")
    p.page.locator("#compare-images").screenshot(path=str(RESULTS / "compare-images.png"))
    p.page.click(f"{cells}[data-run='{runs['img-b']}'] img")
    p.page.wait_for_function(
        f"() => document.querySelector('{full}').complete && document.querySelector('{full}').naturalWidth"
    )
    assert p.page.get_attribute(full, "data-step") == "15" and "img-b" in p.page.inner_text("#lightbox .lightbox-title")
    assert not p.errors, p.errors
    p.page.context.close()


def test_on_a_phone_the_new_forms_fit_the_screen(browser: Any, site: dict[str, Any]) -> None:
    """The run page's edit form (open), the runs table's bulk buttons, the trash and the compare page's
    images scroll nothing sideways at 390 x 844 (tests/console/test_browser_local.py's rule)."""
    ids = {"p1": "c" * 32, "p2": "d" * 32, "p3": "f" * 32}
    with _api(site) as http:
        for name, run_id in ids.items():
            _put_run(http, run_id, name, ["a-rather-long-label-for-a-phone"])
            image = {"name": "samples", "step": 1, "time": 1.0, "png": _png(900, 40, 100)}
            assert (
                http.post(f"/runs/{run_id}/images", json={"start": 0, "end": 100, "images": [image]}).status_code == 200
            )
        assert http.delete(f"/runs/{ids['p2']}").status_code == 200
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=3, is_mobile=True)
    p = Checked(ctx.new_page(), site["url"])
    login(p, site["keys"]["alice"])
    wide = "Math.max(0, document.scrollingElement.scrollWidth - screen.width)"
    for path in (
        f"/ui/runs/{ids['p1']}",
        "/ui/runs?folder=/alice/edits",
        "/ui/trash",
        f"/ui/compare?ids={ids['p1']}&ids={ids['p3']}",
    ):
        _go(p, path)
        if path.startswith("/ui/runs/"):
            p.page.click("#run-edit summary")
            p.page.wait_for_selector("#images .image-panel img.image-view", timeout=5000)
        if path.startswith("/ui/compare"):
            p.page.wait_for_selector("#compare-images[data-ready='1']")
        assert p.page.evaluate(wide) <= 1, (path, p.page.evaluate(wide))
    assert not p.errors, p.errors
    ctx.close()
