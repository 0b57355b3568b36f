"""The runs table's queries (``listing.list_runs`` behind ``/search/runs`` and ``/ui/runs``) on SQLite
and PostgreSQL: hparam and metric sorts and filters, missing values, Crashed runs, pagination."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import Server, make_server

NOW = datetime.now(timezone.utc)


@pytest.fixture
def server(tmp_path: Path, db_url: str) -> Iterator[Server]:
    srv = make_server(tmp_path, db_url)
    with srv.client:
        yield srv
    srv.client.app.state.engine.dispose()


def _put(server: Server, i: int, hparams: dict[str, Any], acc: list[float] | None, **meta: Any) -> None:
    run_id = f"{i:032x}"
    run = {"id": run_id, "name": f"r{i}", "status": "Complete", "hparams": hparams, "labels": [f"l{i % 2}"]}
    run.update({"start_time": (NOW - timedelta(hours=10 - i)).isoformat(), "end_time": NOW.isoformat(), **meta})
    body = {"folder": "t", "make_folder": True, "run": run}
    assert server.req("PUT", f"/runs/{run_id}", json=body).status_code == 200
    if acc is not None:
        points = [{"step": s, "time": 1.0, "metrics": {"acc": a}} for s, a in enumerate(acc)]
        batch = {"type": "val", "start": 0, "end": 1, "points": points}
        assert server.req("POST", f"/runs/{run_id}/metrics", json=batch).status_code == 200


def _names(server: Server, **params: Any) -> list[str]:
    r = server.req("GET", "/search/runs", params=params)
    assert r.status_code == 200, r.text
    return [row["name"] for row in r.json()["runs"]]


@pytest.fixture
def runs(server: Server) -> Server:
    _put(server, 0, {"lr": 0.1, "opt": "adam"}, [0.5, 0.9, 0.7])  # last 0.7, best 0.9
    _put(server, 1, {"lr": 0.01, "opt": "sgd"}, [0.6, 0.8])
    _put(server, 2, {"lr": "auto", "opt": "adam"}, [0.95])  # a string sorts after every number
    _put(server, 3, {"opt": "sgd"}, None)  # no lr, no metric: last whichever the direction
    fresh = datetime.now(timezone.utc).isoformat()  # not NOW (import time): the suite may run for minutes
    _put(server, 4, {"lr": 0.001}, [0.1], status="Running", end_time=None, heartbeat=fresh)
    old = (NOW - timedelta(hours=1)).isoformat()
    _put(server, 5, {"lr": 0.05}, [0.2], status="Running", end_time=None, heartbeat=old, hostname="elsewhere")
    return server


def test_sorts_by_an_hparam_with_missing_values_last(runs: Server) -> None:
    assert _names(runs, sort="hp:lr") == ["r4", "r1", "r5", "r0", "r2", "r3"]
    assert _names(runs, sort="-hp:lr") == ["r2", "r0", "r5", "r1", "r4", "r3"]


def test_filters_by_hparams(runs: Server) -> None:
    assert _names(runs, where="hp:lr<0.05", sort="name") == ["r1", "r4"]
    assert _names(runs, where=["hp:opt=adam", "hp:lr>=0.1"]) == ["r0"]
    assert _names(runs, where="hp:opt~SG", sort="name") == ["r1", "r3"]


def test_sorts_and_filters_by_a_metrics_last_value(runs: Server) -> None:
    assert _names(runs, sort="-m:val/acc") == ["r2", "r1", "r0", "r5", "r4", "r3"]
    assert _names(runs, sort="m:val/acc") == ["r4", "r5", "r0", "r1", "r2", "r3"]
    assert _names(runs, where="m:val/acc>=0.7", sort="name") == ["r0", "r1", "r2"]
    row = next(r for r in runs.req("GET", "/search/runs", params={"q": "r0"}).json()["runs"])
    assert row["metrics"]["val/acc"] == {"last": 0.7, "best": 0.9, "min": 0.5, "max": 0.9}
    assert row["hparams"] == {"lr": 0.1, "opt": "adam"} and row["labels"] == ["l0"]


def test_sorts_by_a_metrics_best_min_and_max_as_the_filter_reads_them(runs: Server) -> None:
    """Issue 33, item 8: the filter read ``m:val/acc.best``, the sort only the last value. Best is the
    run's recorded mode, else the name rule (acc: the maximum), as in a filter."""
    assert _names(runs, sort="-m:val/acc.best") == ["r2", "r0", "r1", "r5", "r4", "r3"]  # 0.95 0.9 0.8 0.2 0.1
    assert _names(runs, sort="m:val/acc.min") == ["r4", "r5", "r0", "r1", "r2", "r3"]  # 0.1 0.2 0.5 0.6 0.95
    assert _names(runs, sort="-m:val/acc.max") == ["r2", "r0", "r1", "r5", "r4", "r3"]
    assert _names(runs, sort="m:val/acc.last") == _names(runs, sort="m:val/acc")
    _put(runs, 6, {"lr": 0.2}, [0.05, 0.99], metric_modes={"val/acc": "min"})  # recorded: its best is 0.05
    assert _names(runs, sort="m:val/acc.best")[:2] == ["r6", "r4"]
    assert _names(runs, where="m:val/acc.best < 0.1", sort="m:val/acc.best") == ["r6"]  # the value the filter reads
    r = runs.req("GET", "/search/runs", params={"sort": '-m:"val/acc".median'})
    assert r.status_code == 422 and "read as .last, .best, .min or .max" in r.text, r.text


def test_the_folder_page_sorts_its_own_runs_for_those_who_may_view_them(runs: Server) -> None:
    """Issue 33, item 8: the folder page's headers sort its runs (not its sub-folders'), by the server."""
    body = {"folder": "t/sub", "make_folder": True, "run": {"id": "f" * 32, "name": "deeper", "status": "Complete"}}
    assert runs.req("PUT", f"/runs/{'f' * 32}", json=body).status_code == 200
    runs.console_login()
    page = runs.client.get("/ui/folders", params={"path": "/alice/t", "sort": "-m:val/acc.best", "per_page": 2})
    assert page.status_code == 200
    names = re.findall(r'class="run-link" href="[^"]+">([^<]+)<', page.text)
    assert names == ["r2", "r0"]  # 0.95 and 0.9, the best first; never "deeper" (in t/sub)
    assert "runs: page 1 of 3" in page.text and "sort=-m%3Aval%2Facc.best&amp;page=2" in page.text
    assert re.findall(
        r'class="run-link" href="[^"]+">([^<]+)<',
        runs.client.get(
            "/ui/folders", params={"path": "/alice/t", "sort": "-m:val/acc.best", "per_page": 2, "page": 3}
        ).text,
    ) == ["r4", "r3"]  # 0.1, then the run without val/acc
    runs.add_user("bob")
    runs.console_login("bob")  # a folder not shared with him: the same answer as one that does not exist
    assert runs.client.get("/ui/folders", params={"path": "/alice/t", "sort": "name"}).status_code == 404


def test_a_running_run_without_a_heartbeat_for_minutes_is_crashed(runs: Server) -> None:
    page = runs.req("GET", "/search/runs", params={"sort": "name"}).json()
    status = {r["name"]: r["status"] for r in page["runs"]}
    assert status == {
        "r0": "Complete",
        "r1": "Complete",
        "r2": "Complete",
        "r3": "Complete",
        "r4": "Running",
        "r5": "Crashed",
    }
    assert _names(runs, status="Crashed") == ["r5"]
    assert _names(runs, status="Running") == ["r4"]
    crashed = next(r for r in page["runs"] if r["name"] == "r5")
    assert crashed["duration"] == pytest.approx(4 * 3600.0, abs=1.0)  # start (5 h ago) to its last heartbeat (1 h ago)
    running = next(r for r in page["runs"] if r["name"] == "r4")  # issue 33, item 10: elapsed so far, not None
    assert running["duration"] == pytest.approx((datetime.now(timezone.utc) - NOW).total_seconds() + 6 * 3600, abs=60)
    assert _names(runs, sort="-duration", status="Running") == ["r4"]
    assert _names(runs, sort="status") == ["r0", "r1", "r2", "r3", "r5", "r4"]  # Complete < Crashed < Running


def _points_at(server: Server, i: int, times: list[datetime]) -> None:
    points = [{"step": s, "time": t.timestamp(), "metrics": {"loss": 1.0}} for s, t in enumerate(times)]
    batch = {"type": "train", "start": 0, "end": 1, "points": points}
    assert server.req("POST", f"/runs/{i:032x}/metrics", json=batch).status_code == 200


def test_a_crashed_run_lasts_until_its_last_point_or_heartbeat_the_later_on_the_table_and_its_page(
    server: Server,
) -> None:
    """Issue 19: the runs table ended a Crashed run at its heartbeat (``r0``: 10 min), its run page
    at its last record (1 h 30 min); both now say the latter."""
    start = datetime.now(timezone.utc) - timedelta(hours=2)
    crashed = {"status": "Running", "end_time": None, "hostname": "elsewhere", "start_time": start.isoformat()}
    _put(server, 0, {}, None, **crashed, heartbeat=(start + timedelta(minutes=10)).isoformat())
    _points_at(server, 0, [start + timedelta(minutes=1), start + timedelta(minutes=90)])  # the later: its last point
    _put(server, 1, {}, None, **crashed, heartbeat=(start + timedelta(minutes=20)).isoformat())
    _points_at(server, 1, [start + timedelta(minutes=5)])  # the later: its heartbeat
    naive = {**crashed, "start_time": "2020-01-01T10:00:00", "heartbeat": "2020-01-01T10:10:00"}
    _put(server, 2, {}, None, **naive)  # a start without a zone: the heartbeat's and the points' read as UTC
    _points_at(server, 2, [datetime(2020, 1, 1, 11, 0, tzinfo=timezone.utc)])
    page = server.req("GET", "/search/runs", params={"sort": "name"}).json()
    assert {r["name"]: (r["status"], r["duration"]) for r in page["runs"]} == {
        "r0": ("Crashed", pytest.approx(5400.0)),
        "r1": ("Crashed", pytest.approx(1200.0)),
        "r2": ("Crashed", pytest.approx(3600.0)),
    }
    assert _names(server, sort="duration") == ["r1", "r2", "r0"]
    assert _names(server, sort="duration", status="Crashed") == ["r1", "r2", "r0"]
    server.console_login()
    for i, shown in enumerate(["1h 30m", "20m 00s", "1h 00m"]):
        html = server.client.get(f"/ui/runs/{i:032x}").text
        assert f'<dd id="run-duration">{shown} <span' in html, html[html.find("run-duration") - 10 :][:200]


def test_pages_do_not_overlap_and_the_default_order_is_newest_first(runs: Server) -> None:
    assert _names(runs) == ["r5", "r4", "r3", "r2", "r1", "r0"]
    assert _names(runs, sort="start") == ["r0", "r1", "r2", "r3", "r4", "r5"]
    pages = [_names(runs, sort="hp:opt", per_page=2, page=p) for p in (1, 2, 3)]
    flat = [n for page in pages for n in page]
    assert sorted(flat) == ["r0", "r1", "r2", "r3", "r4", "r5"]  # ties (same opt) split across pages, none twice
    assert _names(runs, label="l1", sort="name") == ["r1", "r3", "r5"]
    found = runs.req("GET", "/search/runs", params={"per_page": 4, "page": 9}).json()
    assert found["page"] == 2 and found["total"] == 6 and len(found["runs"]) == 2  # past the end: the last page


def test_the_columns_are_the_hparams_that_vary_flattened_and_nested_ones_sort_and_filter(server: Server) -> None:
    """Issue 19: before, the first 8 hparams by name (constants among them, the swept one maybe not) and
    nested hparams as one JSON blob that could be neither sorted nor filtered."""
    consts = {f"a{i}": i for i in range(9)}  # nine constants that sort before lr
    for i, (lr, beta) in enumerate([(0.1, 0.9), (0.01, 0.99), (0.001, 0.9)]):
        _put(server, i, {**consts, "lr": lr, "opt": {"name": "adam", "beta": beta}}, [0.5 + i / 10])
    page = server.req("GET", "/search/runs").json()
    assert page["hparam_keys"] == ["lr", "opt.beta"]
    assert page["hparam_choices"] == [*sorted(consts), "lr", "opt.beta", "opt.name"]
    assert page["runs"][0]["hparams"]["opt.beta"] == 0.9 and "opt" not in page["runs"][0]["hparams"]
    assert page["metric_keys"] == ["val/acc"] and page["metric_modes"] == {"val/acc": "max"}
    assert _names(server, sort="hp:opt.beta") in (["r0", "r2", "r1"], ["r2", "r0", "r1"])
    assert _names(server, where="hp:opt.beta>0.95") == ["r1"]
    assert _names(server, where="hp:opt.name=adam", sort="name") == ["r0", "r1", "r2"]
    one = server.req("GET", "/search/runs", params={"q": "r1"}).json()
    assert "a0" in one["hparam_keys"] and "lr" in one["hparam_keys"]  # a single run: nothing varies, all shown
    filtered = server.req("GET", "/search/runs", params={"where": "hp:a3=3", "sort": "name"}).json()
    assert "a3" in filtered["hparam_keys"]  # what is filtered on is shown, though constant
