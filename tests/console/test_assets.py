"""How the console's answers travel (issue 19, "Speed"): the run page loads uPlot, not the 4.8 MB
plotly.js, with its series preloaded; versioned scripts cached for a year; pages, scripts and
chart series gzipped, downloads never; the vendored libraries carry their licenses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ember.server.console import assets
from tests.server.conftest import Server, make_server

RUN = "a" * 32
STATIC = Path(assets.__file__).parent / "static"


@pytest.fixture
def server(tmp_path: Path) -> Server:
    srv = make_server(tmp_path, f"sqlite:///{tmp_path / 'server.db'}")
    body = {"folder": "x", "make_folder": True, "run": {"id": RUN, "name": "r", "status": "Complete"}}
    assert srv.req("PUT", f"/runs/{RUN}", json=body).status_code == 200
    points = [{"step": s, "time": 1.0, "metrics": {"loss": 1 / (s + 1), "acc": s / 500}} for s in range(500)]
    assert (
        srv.req(
            "POST", f"/runs/{RUN}/metrics", json={"type": "train", "start": 0, "end": 1, "points": points}
        ).status_code
        == 200
    )
    log = "".join(f"line {i}\n" for i in range(500))
    assert srv.req("POST", f"/runs/{RUN}/log", json={"start": 0, "end": len(log), "text": log}).status_code == 200
    srv.console_login()
    return srv


def test_the_run_page_loads_uplot_versioned_with_its_series_preloaded(server: Server) -> None:
    page = server.client.get(f"/ui/runs/{RUN}")
    assert page.status_code == 200 and "plotly" not in page.text
    charts = ("/ui/static/uPlot.iife.min.js", "/ui/static/run.js")
    scripts = [s for s in re.findall(r'<script src="([^"]+)"', page.text) if s.startswith(charts)]
    assert [s.split("?")[0] for s in scripts] == list(charts)
    assert all(s.endswith(f"?v={assets.VERSION}") for s in scripts)
    assert re.search(rf'rel="preload" as="fetch" crossorigin href="/ui/runs/{RUN}/series\?type=train"', page.text)
    for url in scripts:
        r = server.client.get(url)
        assert r.status_code == 200 and r.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert server.client.get("/ui/static/run.js").headers["cache-control"] == "no-cache"  # revalidated
    assert server.client.get("/ui/static/console.css").headers["cache-control"] == "no-cache"


@pytest.mark.parametrize(
    "path", [f"/ui/runs/{RUN}", f"/ui/runs/{RUN}/series?type=train", "/ui/static/run.js", "/ui/vendor/plotly.min.js"]
)
def test_pages_scripts_and_series_are_gzipped(server: Server, path: str) -> None:
    r = server.client.get(path, headers={"Accept-Encoding": "gzip"})
    assert r.status_code == 200 and r.headers.get("content-encoding") == "gzip", r.headers


@pytest.mark.parametrize(
    "path",
    [f"/ui/runs/{RUN}/metrics.csv?type=train", f"/ui/runs/{RUN}/metrics.json?type=train", f"/ui/runs/{RUN}/output.log"],
)
def test_downloads_are_never_gzipped(server: Server, path: str) -> None:
    r = server.client.get(path, headers={"Accept-Encoding": "gzip"})
    assert r.status_code == 200 and "content-encoding" not in r.headers, r.headers


def test_the_output_download_is_the_whole_log(server: Server) -> None:
    r = server.client.get(f"/ui/runs/{RUN}/output.log")
    assert r.text.count("\n") == 500 and r.headers["content-disposition"].startswith("attachment")


def test_vendored_libraries_ship_with_their_licenses() -> None:
    for library, license_ in (("uPlot.iife.min.js", "uPlot.LICENSE"), ("plotly.min.js", "plotly.LICENSE")):
        assert (STATIC / library).stat().st_size > 10_000
        assert "MIT License" in (STATIC / license_).read_text() or "The MIT License" in (STATIC / license_).read_text()
    assert (STATIC / "plotly.min.js").stat().st_size < 6_000_000
