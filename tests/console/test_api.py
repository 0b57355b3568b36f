"""Server endpoints behind the console: paginated search, permissions in search (item 2), and the
downsampled series of a long run (item 3; its time at 3 metrics x 1,000,000 points is
``benchmarks/server_series.py``'s, not a test's)."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest

from tests.server.conftest import Server, make_server

RUN = "b" * 32


@pytest.fixture
def server(tmp_path: Path) -> Server:
    srv = make_server(tmp_path, f"sqlite:///{tmp_path / 'server.db'}")
    srv.add_user("bob")
    return srv


def _run(server: Server, user: str, folder: str, run_id: str, name: str, lr: float) -> None:
    body = {
        "folder": folder,
        "make_folder": True,
        "run": {"id": run_id, "name": name, "status": "Complete", "hparams": {"lr": lr}, "labels": ["x"]},
    }
    assert server.req("PUT", f"/runs/{run_id}", user=user, json=body).status_code == 200
    points = [{"step": s, "time": 1.0, "metrics": {"loss": lr / (s + 1)}} for s in range(5)]
    batch = {"type": "train", "start": 0, "end": 10, "points": points}
    assert server.req("POST", f"/runs/{run_id}/metrics", user=user, json=batch).status_code == 200


def test_search_filters_sorts_paginates_and_hides_private_runs(server: Server) -> None:
    for i in range(7):
        _run(server, "alice", "private", f"{i:032x}", f"r{i}", 0.01 * (i + 1))
    _run(server, "bob", "mine", "f" * 32, "bobs", 0.5)
    page = server.req("GET", "/search/runs", params={"sort": "hp:lr", "per_page": 3, "page": 2}).json()
    assert page["total"] == 7 and [r["name"] for r in page["runs"]] == ["r3", "r4", "r5"]
    got = server.req("GET", "/search/runs", params={"where": ["hp:lr>=0.05", "m:train/loss<0.02"]}).json()
    assert sorted(r["name"] for r in got["runs"]) == ["r4", "r5", "r6"]
    assert got["runs"][0]["metrics"]["train/loss"]["best"] == pytest.approx(got["runs"][0]["hparams"]["lr"] / 5)
    bob = server.req("GET", "/search/runs", user="bob", params={"q": "r"}).json()
    assert [r["name"] for r in bob["runs"]] == []
    assert [r["name"] for r in server.req("GET", "/search/runs", user="bob").json()["runs"]] == ["bobs"]
    assert server.req("GET", "/search/runs", params={"where": "lr>1"}).status_code == 422
    csv = server.req("GET", f"/runs/{0:032x}/metrics.csv", params={"type": "train"})
    want = [f"{s},,1.0,loss,{0.01 / (s + 1)}" for s in range(5)]
    assert csv.text.splitlines() == ["step,epoch,time,name,value", *want]
    assert server.req("GET", f"/runs/{0:032x}/metrics.csv", user="bob", params={"type": "train"}).status_code == 404
    server.req("PUT", "/shares", json={"kind": "folder", "target": "/alice/private", "grantee": "bob", "level": "view"})
    assert server.req("GET", "/search/runs", user="bob", params={"q": "r"}).json()["total"] == 7


def test_three_metrics_of_many_points_are_downsampled_and_keep_spikes(server: Server, tmp_path: Path) -> None:
    _run(server, "alice", "big", RUN, "big", 0.1)
    app = server.client.app
    with app.state.sessions() as session:
        from sqlalchemy import select

        from ember.server.storage.models import Run

        pk = session.scalar(select(Run.pk).where(Run.id == RUN))
    n, chunk = 200_000, 50_000
    db = sqlite3.connect(tmp_path / "server.db")
    for start in range(5, n, chunk):  # as an upload would: batch by batch, the summary kept warm
        rows = [
            (pk, "train", s, name, s / 1000, 0.0, 1000.0 if (s, name) == (177_777, "loss") else math.sin(s / 5000))
            for s in range(start, min(n, start + chunk))
            for name in ("loss", "acc", "lr")
        ]
        db.executemany(
            "INSERT INTO metric_points (run_pk, type, step, name, epoch, time, value) VALUES (?,?,?,?,?,?,?)", rows
        )
        db.commit()
        with app.state.sessions() as session:
            app.state.series.refresh(session, pk, RUN, "train")
    db.close()
    r = server.req("GET", f"/runs/{RUN}/series", params={"type": "train"})
    assert r.status_code == 200
    metrics = r.json()["metrics"]
    assert [metrics[k]["count"] for k in ("loss", "acc", "lr")] == [n, n - 5, n - 5]
    assert all(m["downsampled"] and len(m["value"]) <= 2200 for m in metrics.values())
    assert max(v for v in metrics["loss"]["value"] if v is not None) == 1000.0  # the spike survives
    assert min(metrics["acc"]["value"]) == pytest.approx(-1.0, abs=1e-6)
