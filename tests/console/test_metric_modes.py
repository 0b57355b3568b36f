"""The runs table and the compare page take a metric's "best" from the mode its runs recorded (issue 19).

Before, both read it from the metric's name alone: ``val/score_gap`` (a gap, recorded as ``min``)
was shown at its maximum, the run with the largest gap highlighted as the best.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import Server, make_server

GAPS = {"wide": [0.3, 0.9], "narrow": [0.1, 0.2], "middle": [0.5, 0.6]}
"""Per run, its val/score_gap values: the smallest is narrow's 0.1, the largest wide's 0.9."""


@pytest.fixture
def server(tmp_path: Path, db_url: str) -> Iterator[Server]:
    srv = make_server(tmp_path, db_url)
    with srv.client:
        srv.console_login()
        yield srv
    srv.client.app.state.engine.dispose()


def _put(server: Server, i: int, name: str, modes: Any, folder: str = "t") -> str:
    run_id = f"{i:032x}"
    run: dict[str, Any] = {"id": run_id, "name": name, "status": "Complete", "hparams": {"i": i}}
    if modes is not None:
        run["metric_modes"] = modes
    body = {"folder": folder, "make_folder": True, "run": run}
    assert server.req("PUT", f"/runs/{run_id}", json=body).status_code == 200
    points = [{"step": s, "time": 1.0, "metrics": {"score_gap": v}} for s, v in enumerate(GAPS[name])]
    batch = {"type": "val", "start": 0, "end": 1, "points": points}
    assert server.req("POST", f"/runs/{run_id}/metrics", json=batch).status_code == 200
    return run_id


def _page(server: Server, folder: str = "/alice/t") -> dict[str, Any]:
    r = server.req("GET", "/search/runs", params={"folder": folder, "sort": "name"})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _bests(page: dict[str, Any]) -> dict[str, float]:
    return {row["name"]: row["metrics"]["val/score_gap"]["best"] for row in page["runs"]}


def test_the_runs_table_follows_the_recorded_mode_not_the_name(server: Server) -> None:
    for i, name in enumerate(GAPS):
        _put(server, i, name, {"val/score_gap": "min"})
    page = _page(server)
    assert page["metric_modes"]["val/score_gap"] == "min"  # the name reads as a score: max
    assert _bests(page) == {"wide": 0.3, "narrow": 0.1, "middle": 0.5}
    html = server.client.get("/ui/runs", params={"folder": "/alice/t"}).text
    header = re.search(r'<th class="metric" data-col="m:val/score_gap".*?</th>', html, re.S)
    assert header and "best (min)" in header.group(0)


@pytest.mark.parametrize(
    ("modes", "expected"),
    [
        ([{"val/score_gap": "min"}, {"val/score_gap": "min"}, {"val/score_gap": "max"}], "min"),  # most say min
        ([{"val/score_gap": "min"}, None, None], "min"),  # runs that record nothing do not vote
        ([{"val/score_gap": "min"}, {"val/score_gap": "max"}, None], "max"),  # a tie: the name rule
        ([None, None, None], "max"),  # nothing recorded: the name rule
        # what no ember wrote is ignored, and breaks nothing
        ([{"val/score_gap": "sideways"}, "oops", {"val/score_gap": ["min"]}], "max"),
    ],
)
def test_runs_that_disagree_share_the_mode_most_of_them_record(server: Server, modes: list[Any], expected: str) -> None:
    for i, (name, recorded) in enumerate(zip(GAPS, modes, strict=True)):
        _put(server, i, name, recorded)
    page = _page(server)
    assert page["metric_modes"]["val/score_gap"] == expected
    pick = min if expected == "min" else max
    assert _bests(page) == {name: pick(values) for name, values in GAPS.items()}  # one mode for the column


def test_the_compare_page_highlights_the_best_by_the_recorded_mode(server: Server) -> None:
    ids = {name: _put(server, i, name, {"val/score_gap": "min"}) for i, name in enumerate(GAPS)}
    html = server.client.get("/ui/compare", params={"ids": list(ids.values())}).text
    assert "last · best (min)" in html
    best = re.findall(
        r'<tr data-run="(\w+)">(?:(?!</tr>).)*?<td class="num best" data-metric="val/score_gap"', html, re.S
    )
    assert best == [ids["narrow"]]  # the smallest gap, not wide's 0.9
    data = re.search(r'<script type="application/json" id="compare-data">(.*?)</script>', html, re.S)
    assert data and json.loads(data.group(1))["modes"] == {"val/score_gap": "min"}  # what compare.js stars by


def test_a_single_runs_recorded_mode_is_its_own(server: Server) -> None:
    _put(server, 0, "wide", {"val/score_gap": "min"}, folder="one")
    _put(server, 1, "narrow", {"val/score_gap": "max"}, folder="two")
    assert _bests(_page(server, "/alice/one")) == {"wide": 0.3}
    assert _bests(_page(server, "/alice/two")) == {"narrow": 0.2}
