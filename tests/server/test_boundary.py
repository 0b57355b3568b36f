"""What the server accepts it can give back (issue 17, item 4).

NaN and infinities in hparams or times, lone surrogates in names, values and paths, NUL in keys
used to be stored (or to fail with a 500 on write) and then made the run, and every listing
that included it, answer 500 to all its viewers. They are refused at the boundary with a 422
naming the field, and rows stored before that are read back without error.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sqlalchemy import text

from tests.server.conftest import Server

RUN = "d" * 32
GOOD = "e" * 32


def _raw(server: Server, method: str, path: str, body_text: str) -> Any:
    """Send JSON text as it is (httpx would refuse to encode NaN or lone surrogates)."""
    headers = {**server.h(), "content-type": "application/json"}
    return server.client.request(method, f"/api/v1{path}", headers=headers, content=body_text.encode())


def _put_run(server: Server, run_id: str, **extra: Any) -> None:
    body = {"folder": "t", "make_folder": True, "run": {"id": run_id, "name": "r", "status": "Running", **extra}}
    assert server.req("PUT", f"/runs/{run_id}", json=body).status_code == 200


RUN_JSON = '{"folder": "t", "make_folder": true, "run": {"id": "' + RUN + '", "status": "Running", %s}}'
POINTS = '{"type": "train", "start": 0, "end": 10, "points": [%s]}'
COLUMNS = '{"type": "train", "start": 0, "end": 10, "step": [1], "epoch": [%s], "time": [%s], "metrics": {"x": [1.0]}}'
ARTIFACT = '{"artifact": {"id": "' + "f" * 32 + '", "name": "a", "files": [{"path": "%s", "size": 1, "sha256": "%s"}]}}'
EDGE = '{"start": 0, "end": 10, "edges": [{"time": %s, "source": {"kind": "run", "id": "' + RUN + '", "name": "%s"}, '
EDGE += '"target": {"kind": "artifact", "id": "' + "f" * 32 + '", "name": "a"}}]}'
CASES = [
    ("PUT", f"/runs/{RUN}", RUN_JSON % '"name": "r", "hparams": {"lr": NaN}', "run.hparams.lr"),
    ("PUT", f"/runs/{RUN}", RUN_JSON % '"name": "r", "hparams": {"lr": -Infinity}', "run.hparams.lr"),
    ("PUT", f"/runs/{RUN}", RUN_JSON % '"name": "r", "hparams": {"lr": 1e999}', "run.hparams.lr"),
    ("PUT", f"/runs/{RUN}", RUN_JSON % '"name": "r\\ud800"', "run.name"),
    ("PUT", f"/runs/{RUN}", RUN_JSON % '"name": "r", "labels": ["ok", "\\udfff"]', "run.labels[1]"),
    ("PUT", f"/runs/{RUN}", RUN_JSON % '"name": "r", "hparams": {"a\\u0000b": 1}', 'run.hparams."a\\u0000b" (the key)'),
    ("PUT", f"/runs/{RUN}", RUN_JSON % '"name": "r", "description": "x\\u0000"', "run.description"),
    ("POST", f"/runs/{GOOD}/metrics", POINTS % '{"step": 1, "time": Infinity, "metrics": {"x": 1}}', "points[0].time"),
    (
        "POST",
        f"/runs/{GOOD}/metrics",
        POINTS % '{"step": 1, "time": 1, "epoch": NaN, "metrics": {}}',
        "points[0].epoch",
    ),
    (
        "POST",
        f"/runs/{GOOD}/metrics",
        POINTS % '{"step": 1, "time": 1, "metrics": {"\\ud83d": 1}}',
        'points[0].metrics."\\ud83d" (the key)',
    ),
    ("POST", f"/runs/{GOOD}/metrics", COLUMNS % ("-Infinity", "1.0"), "epoch[0]"),
    ("POST", f"/runs/{GOOD}/metrics", COLUMNS % ("null", "1e400"), "time[0]"),
    ("POST", f"/runs/{GOOD}/log", '{"start": 0, "end": 3, "text": "a\\u0000b"}', "text"),
    ("POST", f"/runs/{GOOD}/lineage", EDGE % ("Infinity", "r"), "edges[0].time"),
    ("POST", f"/runs/{GOOD}/lineage", EDGE % ("1.0", "\\ud800"), "edges[0].source.name"),
    ("PUT", f"/artifacts/{'f' * 32}", ARTIFACT % ("w/\\udc00.pt", "0" * 64), "artifact.files[0].path"),
    ("GET", "/search/runs?q=%00", "", "URL"),
]


def test_what_could_not_be_read_back_is_refused_naming_the_field(server: Server) -> None:
    _put_run(server, GOOD)
    for method, path, body, field in CASES:
        r = _raw(server, method, path, body)
        assert r.status_code == 422, (field, r.status_code, r.text)
        detail = r.json()["detail"]
        if field == "URL":
            assert "NUL" in detail, detail
        else:
            assert detail.startswith(field) and r.json()["errors"][0]["field"] == field, (field, r.json())
        # nothing was stored: the run and every listing still answer
        for read in (f"/runs/{GOOD}", "/search/runs?sort=hp:lr", f"/runs/{GOOD}/metrics?type=train"):
            assert server.req("GET", read).status_code == 200, (field, read)
        assert server.req("GET", f"/runs/{RUN}").status_code == 404, field


def test_rows_stored_before_the_checks_are_read_back(server: Server) -> None:
    _put_run(server, RUN, hparams={"lr": 0.1}, labels=["x"])
    _put_run(server, GOOD, hparams={"lr": 0.01})
    batch = {
        "type": "train",
        "start": 0,
        "end": 10,
        "points": [{"step": s, "time": 1.0, "metrics": {"x": 1.0}} for s in range(3)],
    }
    assert server.req("POST", f"/runs/{RUN}/metrics", json=batch).status_code == 200
    edge = {
        "time": 1.0,
        "source": {"kind": "run", "id": RUN, "name": "r"},
        "target": {"kind": "run", "id": GOOD, "name": "g"},
    }
    assert server.req("POST", f"/runs/{RUN}/lineage", json={"start": 0, "end": 1, "edges": [edge]}).status_code == 200
    sqlite = server.settings.db_url.startswith("sqlite")
    # What each database took from the old server: SQLite kept NaN in JSON, PostgreSQL NUL escapes.
    hparams = '{"lr": NaN, "big": Infinity, "s": "\\ud800", "k\\u0000": 1}' if sqlite else '{"lr": 0.1, "k\\u0000": 1}'
    meta = json.dumps({"id": RUN, "name": "r", "status": "Running", "heartbeat": "\ud800"})
    inf = "9e999" if sqlite else "'Infinity'::float8"
    with server.client.app.state.engine.begin() as conn:
        conn.execute(
            text("UPDATE runs SET hparams = :h, meta = :m, labels = :l WHERE id = :id"),
            {"h": hparams, "m": meta, "l": '["\\ud800"]', "id": RUN},
        )
        conn.execute(text(f"UPDATE metric_points SET time = {inf}, epoch = {inf} WHERE step = 1"))
        conn.execute(text(f"UPDATE lineage SET time = {inf}"))
    got = server.req("GET", f"/runs/{RUN}")
    assert got.status_code == 200, got.text
    if sqlite:
        assert got.json()["hparams"]["lr"] == "NaN" and got.json()["hparams"]["s"] == "\ufffd"
    assert got.json()["lineage"][0]["time"] == "Infinity"
    for sort in ("hp:lr", "-hp:k", "status", "-start"):
        page = server.req("GET", "/search/runs", params={"sort": sort, "where": "hp:lr>0.001"})
        assert page.status_code == 200, (sort, page.text)
        assert GOOD in [r["id"] for r in page.json()["runs"]]
    for path in ("metrics", "metrics.csv", "series"):
        r = server.req("GET", f"/runs/{RUN}/{path}", params={"type": "train"})
        assert r.status_code == 200, (path, r.text)
    points = server.req("GET", f"/runs/{RUN}/metrics", params={"type": "train"}).json()["points"]
    assert points[1]["time"] == "Infinity" and points[1]["epoch"] == "Infinity"
    assert re.search(r"^1,inf,inf,x,1\.0$", server.req("GET", f"/runs/{RUN}/metrics.csv?type=train").text, re.M)
