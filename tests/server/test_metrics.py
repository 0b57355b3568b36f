"""Metric storage: every value stored once and bit-identical, block summaries exact, charts from them,
and migration 0002 upgrading a database that already holds points."""

from __future__ import annotations

import math
import random
import struct
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, text

from ember.server.app import create_app
from ember.server.storage.models import BLOCK, MetricBlock, MetricPoint, Run
from ember.server.storage.settings import Settings
from tests.server.conftest import Server, alembic_to, make_server

RUN = "c" * 32


def _new_run(server: Server, run_id: str = RUN) -> None:
    body = {"run": {"id": run_id, "name": "m", "status": "Running"}}
    assert server.req("PUT", f"/runs/{run_id}", json=body).status_code == 200


def _post(server: Server, body: dict[str, Any], status: int = 200) -> Any:
    r = server.req("POST", f"/runs/{RUN}/metrics", json=body)
    assert r.status_code == status, r.text
    return r.json()


def _bits(value: float) -> bytes:
    return struct.pack("<d", value)


def _stored(server: Server) -> dict[tuple[str, int], float | None]:
    with server.client.app.state.sessions() as session:
        rows = session.execute(select(MetricPoint.name, MetricPoint.step, MetricPoint.value)).all()
    return {(name, step): value for name, step, value in rows}


def _blocks_from_points(server: Server) -> list[tuple[Any, ...]]:
    """What the summaries must hold, computed in Python from the stored points."""
    p = MetricPoint
    with server.client.app.state.sessions() as session:
        rows = session.execute(select(p.run_pk, p.type, p.name, p.step, p.epoch, p.time, p.value)).all()
    groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for pk, type_, name, step, epoch, time, value in rows:
        groups.setdefault((pk, type_, name, step // BLOCK), []).append((step, epoch, time, value))
    out = []
    for key, points in sorted(groups.items()):
        points.sort()
        values = [v for *_, v in points if v is not None]
        steps = [s for s, *_ in points]
        lo, hi = min(values, default=None), max(values, default=None)
        at_lo = next((pt[:3] for pt in points if pt[3] is not None and pt[3] == lo), (None,) * 3)  # the first
        at_hi = next((pt[:3] for pt in points if pt[3] is not None and pt[3] == hi), (None,) * 3)
        out.append((*key, min(steps), max(steps), lo, hi, len(points), *at_lo, *at_hi))
    return out


def _blocks(server: Server) -> list[tuple[Any, ...]]:
    b = MetricBlock
    at = (b.min_at_step, b.min_at_epoch, b.min_at_time, b.max_at_step, b.max_at_epoch, b.max_at_time)
    with server.client.app.state.sessions() as session:
        rows = session.execute(
            select(
                b.run_pk, b.type, b.name, b.block, b.first_step, b.last_step, b.min_value, b.max_value, b.count
            ).add_columns(*at)
        ).all()
    return sorted(tuple(r) for r in rows)


def test_columns_and_points_store_every_value_once_and_bit_identical(server: Server) -> None:
    _new_run(server)
    rng = random.Random(0)
    values = [rng.uniform(-1e300, 1e300) for _ in range(300)] + [5e-324, -0.0, 0.1 + 0.2, 2**53 + 1.0, 1e308]
    steps = list(range(len(values)))
    sparse = ["NaN" if s == 7 else "Infinity" if s == 8 else "-Infinity" if s == 9 else None for s in steps]
    sparse[100] = 3  # an int logs as the float 3.0
    columns = {
        "type": "train",
        "start": 0,
        "end": 1000,
        "step": steps,
        "epoch": [None if s < 10 else s / 7 for s in steps],
        "time": [1.7e9 + s / 3 for s in steps],
        "metrics": {"v": values, "sparse": sparse},
    }
    assert _post(server, columns) == {"cursor": 1000}
    points = [{"step": 1000 + i, "time": 1.0, "metrics": {"v": x, "w": "NaN"}} for i, x in enumerate(values[:50])]
    _post(server, {"type": "train", "start": 1000, "end": 1500, "points": points})
    stored = _stored(server)
    assert len(stored) == len(values) + 4 + 100  # absent (null) cells are not points
    sqlite = server.settings.db_url.startswith("sqlite")
    for s, x in zip(steps, values, strict=True):
        if sqlite and x == 0.0:  # SQLite writes a whole REAL as an integer on disk: -0.0 reads back 0.0
            assert stored[("v", s)] == 0.0
            continue
        assert _bits(stored[("v", s)]) == _bits(x)  # type: ignore[arg-type]
    for i, x in enumerate(values[:50]):
        assert _bits(stored[("v", 1000 + i)]) == _bits(x)  # type: ignore[arg-type]
        assert stored[("w", 1000 + i)] is None  # NaN is NULL
    assert stored[("sparse", 7)] is None and stored[("sparse", 8)] == math.inf and stored[("sparse", 9)] == -math.inf
    assert stored[("sparse", 100)] == 3.0 and ("sparse", 11) not in stored
    served = server.req("GET", f"/runs/{RUN}/metrics", params={"type": "train"}).json()["points"]
    by_step = {p["step"]: p for p in served}
    assert by_step[7]["metrics"] == {"v": values[7], "sparse": "NaN"}
    assert by_step[9]["metrics"]["sparse"] == "-Infinity" and by_step[20]["epoch"] == 20 / 7
    assert _blocks(server) == _blocks_from_points(server)


def test_a_batch_sent_again_or_overlapping_keeps_points_and_blocks_exact(server: Server) -> None:
    _new_run(server)

    def batch(start: int, lo: int, hi: int, value: float) -> dict[str, Any]:
        steps = list(range(lo, hi))
        return {
            "type": "train",
            "start": start,
            "end": start + 10,
            "step": steps,
            "epoch": [None] * len(steps),
            "time": [0.0] * len(steps),
            "metrics": {"loss": [value] * len(steps)},
        }

    _post(server, batch(0, 0, 300, 1.0))
    _post(server, batch(0, 0, 300, 9.0))  # the same range again (a retry): nothing changes
    _post(server, batch(10, 250, 400, 5.0))  # overlaps stored steps and shares their block
    stored = _stored(server)
    assert len(stored) == 400 and stored[("loss", 299)] == 1.0 and stored[("loss", 300)] == 5.0
    assert _blocks(server) == _blocks_from_points(server)
    counts = server.req("GET", f"/runs/{RUN}").json()["metrics"]
    assert counts == [{"type": "train", "name": "loss", "count": 400, "last_step": 399}]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"step": [1, 2], "epoch": [None], "time": [0.0, 0.0], "metrics": {"x": [1.0, 2.0]}}, "one entry per line"),
        ({"step": [1], "epoch": [None], "time": [0.0], "metrics": {"x": [1.0, 2.0]}}, "one entry per line"),
        ({"step": [1], "epoch": [None], "time": [0.0]}, "all of the columns"),
        (
            {"step": [1], "epoch": [None], "time": [0.0], "metrics": {}, "points": []},
            "not both",
        ),
        ({"step": [-1], "epoch": [None], "time": [0.0], "metrics": {"x": [1.0]}}, ""),
        ({"step": [1], "epoch": [None], "time": [0.0], "metrics": {"x": ["high"]}}, ""),
        ({"step": [1], "epoch": [None], "time": [0.0], "metrics": {"x": [True]}}, ""),
        ({"step": [1.5], "epoch": [None], "time": [0.0], "metrics": {"x": [1.0]}}, ""),
    ],
)
def test_malformed_columns_are_refused_with_422(server: Server, body: dict[str, Any], message: str) -> None:
    _new_run(server)
    r = server.req("POST", f"/runs/{RUN}/metrics", json={"type": "train", "start": 0, "end": 1, **body})
    assert r.status_code == 422 and message in r.json()["detail"], r.text
    assert _stored(server) == {}


def test_a_batch_over_the_value_limit_gets_413(tmp_path: Path, db_url: str) -> None:
    srv = make_server(tmp_path, db_url)
    _new_run(srv)
    n = srv.settings.max_batch_points // 2 + 1
    body = {"type": "t", "start": 0, "end": 1, "step": list(range(n)), "epoch": [None] * n, "time": [0.0] * n}
    body["metrics"] = {"a": [1.0] * n, "b": [None] * n}
    r = srv.req("POST", f"/runs/{RUN}/metrics", json=body)
    assert r.status_code == 413 and "fewer lines" in r.json()["detail"]
    srv.client.app.state.engine.dispose()


def _upload_long_series(server: Server, n: int) -> dict[str, list[float]]:
    rng = random.Random(1)
    series = {
        "loss": [math.sin(s / 500) + rng.random() / 10 for s in range(n)],
        "acc": [rng.random() for s in range(n)],
    }
    series["loss"][n // 3] = 1e6  # a one-point spike
    series["acc"][n // 2] = -1e6
    for i, lo in enumerate(range(0, n, 10_000)):
        steps = list(range(lo, min(n, lo + 10_000)))
        body = {
            "type": "train",
            "start": i,
            "end": i + 1,
            "step": steps,
            "epoch": [s / 1000 for s in steps],
            "time": [0.0] * len(steps),
            "metrics": {name: values[lo : lo + 10_000] for name, values in series.items()},
        }
        assert server.req("POST", f"/runs/{RUN}/metrics", json=body).status_code == 200
    return series


def test_long_series_are_downsampled_from_blocks_keeping_extremes(server: Server) -> None:
    _new_run(server)
    n = 60_000  # 469 blocks of 128 steps: more than the 100 buckets, so they are read from the blocks
    series = _upload_long_series(server, n)
    got = server.req("GET", f"/runs/{RUN}/series", params={"type": "train", "buckets": 100}).json()["metrics"]
    for name, values in series.items():
        chart = got[name]
        assert chart["count"] == n and chart["downsampled"] and len(chart["value"]) <= 200
        assert max(chart["value"]) == max(values) and min(chart["value"]) == min(values)
        assert chart["step"] == sorted(chart["step"]) and chart["step"][0] >= 0 and chart["step"][-1] <= n - 1
        # every point shown is a stored point at its exact step (issue 19: the spike at n // 3 is
        # drawn at n // 3, not at its bucket's last step), with its own epoch
        for step, epoch, value in zip(chart["step"], chart["epoch"], chart["value"], strict=True):
            assert values[step] == value and epoch == step / 1000
        # each bucket's pair is the true min and max of the points between them
        for i in range(0, len(chart["step"]), 2):
            lo, hi = chart["step"][i], chart["step"][i + 1]
            pair = sorted(chart["value"][i : i + 2])
            assert pair == [min(values[lo : hi + 1]), max(values[lo : hi + 1])]
    extremes = {"loss": (n // 3, 1e6), "acc": (n // 2, -1e6)}
    for name, (step, value) in extremes.items():
        assert got[name]["value"][got[name]["step"].index(step)] == value


@pytest.mark.parametrize("n", [60_000, 5_000], ids=["from-blocks", "bucketed-in-sql"])
def test_an_extreme_held_by_several_points_is_drawn_at_the_first(server: Server, n: int) -> None:
    """A bucket's min and max are drawn at the first step holding them (migration 0007 stores it
    per block); 60,000 points are read from the block summaries, 5,000 bucketed over the points."""
    _new_run(server)
    values = [0.5] * n
    for step in (1000, 1001, 1100):
        values[step] = 2.0
    for step in (4000, 4010):
        values[step] = -1.0
    values[4001] = math.nan
    for i, lo in enumerate(range(0, n, 10_000)):
        steps = list(range(lo, min(n, lo + 10_000)))
        body = {"type": "train", "start": i, "end": i + 1, "step": steps, "epoch": [None] * len(steps)}
        loss = ["NaN" if math.isnan(values[s]) else values[s] for s in steps]
        _post(server, body | {"time": [0.0] * len(steps), "metrics": {"loss": loss}})
    chart = server.req("GET", f"/runs/{RUN}/series", params={"type": "train", "buckets": 100}).json()["metrics"]
    loss = chart["loss"]
    assert loss["downsampled"] and loss["count"] == n
    shown = dict(zip(loss["step"], loss["value"], strict=True))
    assert shown[1000] == 2.0 and 1001 not in shown
    assert shown[4000] == -1.0 and 4010 not in shown
    assert all(values[step] == value for step, value in shown.items())


def test_a_zoomed_range_is_bucketed_finer_and_sent_whole_when_small(server: Server) -> None:
    """Issue 19: a chart zoomed to a step range asks for that range and gets it finer."""
    _new_run(server)
    n = 60_000
    series = _upload_long_series(server, n)
    params = {"type": "train", "buckets": 100}
    wide = server.req("GET", f"/runs/{RUN}/series", params={**params, "start": 10_000, "end": 30_000}).json()
    loss = wide["metrics"]["loss"]
    assert loss["downsampled"] and loss["count"] == 20_001 and len(loss["value"]) <= 200
    assert loss["step"][0] >= 10_000 and loss["step"][-1] <= 30_000
    assert max(loss["value"]) == 1e6 and loss["step"][loss["value"].index(1e6)] == n // 3
    narrow = server.req("GET", f"/runs/{RUN}/series", params={**params, "start": 20_005, "end": 20_104}).json()
    loss = narrow["metrics"]["loss"]
    assert not loss["downsampled"] and loss["step"] == list(range(20_005, 20_105))
    assert loss["value"] == series["loss"][20_005:20_105]


def test_a_zoomed_range_reads_the_block_summaries_and_only_the_points_of_its_two_edge_blocks(server: Server) -> None:
    """Issue 30, item 5: a zoom used to read every point of the range (1.75-2.1 s on a million). Every
    point outside the two blocks the range cuts is deleted behind the server's back: the answers stay
    the same, so they were made from the summaries and those two blocks."""
    from ember.server.services.series import MAX_BUCKETS, SeriesReader

    _new_run(server)
    n = 20_000
    series = _upload_long_series(server, n)
    lo, hi = 1_001, 18_998  # cuts blocks 7 and 148; 17,998 points: past RAW_POINTS, so from the blocks
    asks = [{"buckets": 10, "start": lo, "end": hi}, {"buckets": MAX_BUCKETS}, {"buckets": 50, "start": lo}]
    answers = [server.req("GET", f"/runs/{RUN}/series", params={"type": "train", **a}).json()["metrics"] for a in asks]
    zoom = answers[0]
    for name, values in series.items():
        chart = zoom[name]
        assert chart["count"] == hi - lo + 1 and chart["downsampled"] and len(chart["value"]) <= 20
        assert chart["step"][0] >= lo and chart["step"][-1] <= hi
        assert max(chart["value"]) == max(values[lo : hi + 1]) and min(chart["value"]) == min(values[lo : hi + 1])
        for i in range(0, len(chart["step"]), 2):  # each pair: the true extremes of the points between them
            a, b = chart["step"][i], chart["step"][i + 1]
            assert sorted(chart["value"][i : i + 2]) == [min(values[a : b + 1]), max(values[a : b + 1])]
    assert len(answers[1]["loss"]["value"]) == 2 * math.ceil(n / BLOCK)  # fewer blocks than buckets: one each
    with server.client.app.state.engine.begin() as conn:
        keep = [(lo // BLOCK) * BLOCK, (lo // BLOCK + 1) * BLOCK, (hi // BLOCK) * BLOCK, (hi // BLOCK + 1) * BLOCK]
        conn.execute(
            text("DELETE FROM metric_points WHERE NOT (step BETWEEN :a AND :b OR step BETWEEN :c AND :d)"),
            {"a": keep[0], "b": keep[1] - 1, "c": keep[2], "d": keep[3] - 1},
        )
    with server.client.app.state.sessions() as session:
        run_pk = session.scalar(text("SELECT pk FROM runs WHERE id = :id"), {"id": RUN})
        fresh = [SeriesReader().series(session, run_pk, RUN, "train", **a)["metrics"] for a in asks]
    assert fresh == answers
    too_many = server.req("GET", f"/runs/{RUN}/series", params={"type": "train", "buckets": MAX_BUCKETS + 1})
    assert too_many.status_code == 422 and "buckets" in too_many.text


def test_a_short_series_beside_a_long_one_is_sent_whole(server: Server) -> None:
    _new_run(server)
    n = 10_000
    steps = list(range(n))
    rare = [float(s) if s % 1000 == 0 else None for s in steps]
    body = {"type": "train", "start": 0, "end": 1, "step": steps, "epoch": [None] * n, "time": [0.0] * n}
    body["metrics"] = {"loss": [1.0] * n, "rare": rare}
    _post(server, body)
    got = server.req("GET", f"/runs/{RUN}/series", params={"type": "train"}).json()["metrics"]
    assert got["rare"] == {
        "count": 10,
        "downsampled": False,
        "step": list(range(0, n, 1000)),
        "epoch": [None] * 10,
        "time": [0.0] * 10,
        "value": [float(s) for s in range(0, n, 1000)],
        "nonfinite": [],
    }
    assert got["loss"]["count"] == n and got["loss"]["downsampled"]


def test_deleting_a_run_deletes_its_points_and_blocks(server: Server) -> None:
    """DELETE moves the run to the trash (its points kept, restorable); ?purge=true deletes them."""
    _new_run(server)
    _post(server, {"type": "t", "start": 0, "end": 1, "points": [{"step": 1, "time": 0.0, "metrics": {"x": 1.0}}]})
    assert server.req("DELETE", f"/runs/{RUN}").status_code == 200
    assert _stored(server) != {} and server.req("GET", f"/runs/{RUN}").status_code == 404
    assert server.req("DELETE", f"/runs/{RUN}?purge=true").status_code == 200
    assert _stored(server) == {} and _blocks(server) == []


def test_migration_0002_keeps_existing_points_and_summarises_them(tmp_path: Path, db_url: str) -> None:
    """0002 summarises the points already stored, 0007 adds the steps of each block's extremes."""
    alembic_to(db_url, "0001")
    engine = create_engine(db_url)
    points = [(s, name, math.cos(s) if s != 77 else None) for s in range(1000) for name in ("a", "b")]
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO users (id, name, is_admin, created) VALUES (1, 'alice', true, :t)"), {"t": "2026-01-01"}
        )
        conn.execute(
            text("INSERT INTO folders (id, path, parent_id, owner_id, created) VALUES (1, '/alice', NULL, 1, :t)"),
            {"t": "2026-01-01"},
        )
        conn.execute(
            text(
                "INSERT INTO runs (pk, id, folder_id, owner_id, name, status, labels, description, hparams, meta,"
                " platform, uploaded) VALUES (1, :id, 1, 1, 'old', 'Complete', '[]', '', '{}', '{}', '{}', :t)"
            ),
            {"id": RUN, "t": "2026-01-01"},
        )
        conn.execute(
            text(
                "INSERT INTO metric_points (run_pk, type, step, name, epoch, time, value)"
                " VALUES (1, 'train', :s, :n, NULL, 0.5, :v)"
            ),
            [{"s": s, "n": n, "v": v} for s, n, v in points],
        )
    alembic_to(db_url, "head")
    srv = Server(Settings.make(data_dir=tmp_path / "data", db_url=db_url), None)  # type: ignore[arg-type]
    srv.client = TestClient(create_app(srv.settings))
    with srv.client.app.state.sessions() as session:
        stored = session.execute(select(MetricPoint.step, MetricPoint.name, MetricPoint.value)).all()
        assert session.scalar(select(Run.name)) == "old"
    assert sorted(stored, key=lambda r: (r[0], r[1])) == points
    assert _blocks(srv) == _blocks_from_points(srv) and len(_blocks(srv)) == 2 * math.ceil(1000 / BLOCK)
    srv.client.app.state.engine.dispose()
    alembic_to(db_url, "0001", down=True)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM metric_points")).scalar_one() == len(points)
        assert conn.execute(text("SELECT max(id) FROM metric_points")).scalar_one() == len(points)
    engine.dispose()


def test_a_growing_series_reads_again_as_a_fresh_reader_does(server: Server) -> None:
    """The series answers kept per process follow new points (issue 19)."""
    from ember.server.services.series import SeriesReader

    _new_run(server)
    _upload_long_series(server, 30_000)
    params = {"type": "train", "buckets": 100}
    first = server.req("GET", f"/runs/{RUN}/series", params=params).json()["metrics"]
    steps = list(range(30_000, 40_000))
    body = {"type": "train", "start": 3, "end": 4, "step": steps, "epoch": [s / 1000 for s in steps]}
    body |= {"time": [0.0] * len(steps), "metrics": {"loss": [5e6 if s == 35_000 else 0.5 for s in steps]}}
    _post(server, body)
    again = server.req("GET", f"/runs/{RUN}/series", params=params).json()["metrics"]
    assert again["loss"]["count"] == 40_000 and first["loss"]["count"] == 30_000
    assert again["loss"]["step"][again["loss"]["value"].index(5e6)] == 35_000
    sessions = server.client.app.state.sessions
    with sessions() as session:
        run_pk = session.scalar(text("SELECT pk FROM runs WHERE id = :id"), {"id": RUN})
        fresh = SeriesReader().series(session, run_pk, RUN, "train", 100)["metrics"]
    assert again == fresh
