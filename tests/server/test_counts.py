"""What a user may store is bounded by count too (issue 30's hunt, its last "not bounded yet"):
a run's distinct metrics (``--max-run-metrics``), a user's runs (``--max-user-runs``) and folders
(``--max-user-folders``), and metric points counted in the quota (``blobs.POINT_BYTES`` each,
kept on the run by ingest); each past its limit is refused whole with a 413 naming the flag, and
migration 0012 counts the points and metrics of an existing database."""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select, text

from ember import track
from ember.server.services.blobs import POINT_BYTES
from ember.track.client import Client, Credentials, UploadError, upload_run
from tests.server.conftest import Server, alembic_to, make_server

RUN = "c3" * 16


def _batch(start: int, steps: list[int], metrics: dict[str, list[Any]], type_: str = "train") -> dict[str, Any]:
    n = len(steps)
    return {
        "type": type_,
        "start": start,
        "end": start + 10,
        "step": steps,
        "epoch": [None] * n,
        "time": [1.0] * n,
        "metrics": metrics,
    }


def _counters(server: Server, run_id: str) -> tuple[int, int]:
    with server.client.app.state.engine.connect() as conn:
        row = conn.execute(text("SELECT metric_points, metric_names FROM runs WHERE id = :id"), {"id": run_id}).one()
    return int(row[0]), int(row[1])


def _put_run(server: Server, run_id: str = RUN, folder: str = "default", user: str = "alice") -> Any:
    body = {"run": {"id": run_id, "name": "r", "status": "Running"}, "folder": folder, "make_folder": True}
    return server.req("PUT", f"/runs/{run_id}", user=user, json=body)


def test_a_runs_distinct_metrics_are_bounded_and_its_points_count_in_the_quota(tmp_path: Path, db_url: str) -> None:
    from ember.server.services.blobs import usage
    from ember.server.storage.models import User

    server = make_server(tmp_path, db_url, max_run_metrics=3)
    with server.client:
        assert _put_run(server).status_code == 200
        first = _batch(0, [0, 1], {"loss": [1.0, 0.5], "acc": [None, 0.1]})
        assert server.req("POST", f"/runs/{RUN}/metrics", json=first).status_code == 200
        assert _counters(server, RUN) == (3, 2)
        # known names add points, not metrics; a name with no value in the batch is no metric
        known = _batch(10, [2, 3], {"loss": [0.4, 0.3], "lr": [None, None]})
        assert server.req("POST", f"/runs/{RUN}/metrics", json=known).status_code == 200
        assert _counters(server, RUN) == (5, 2)
        # two new names would make 4: refused whole, nothing of the batch kept, the cursor stays
        past = _batch(20, [4], {"loss": [0.2], "x": [1.0], "y": [2.0]})
        refused = server.req("POST", f"/runs/{RUN}/metrics", json=past)
        assert refused.status_code == 413
        assert "4 distinct metrics, over the server's limit of 3 per run" in refused.json()["detail"]
        assert "--max-run-metrics" in refused.json()["detail"]
        assert _counters(server, RUN) == (5, 2)
        view = server.req("GET", f"/runs/{RUN}").json()
        assert [(m["type"], m["name"], m["count"]) for m in view["metrics"]] == [
            ("train", "acc", 1),
            ("train", "loss", 4),
        ]
        assert view["cursors"]["metrics/train.jsonl"] == 20
        # a metric of another type is another metric; the third fits, a fourth does not
        val = _batch(0, [0], {"loss": [0.9]}, type_="val")
        assert server.req("POST", f"/runs/{RUN}/metrics", json=val).status_code == 200
        assert _counters(server, RUN) == (6, 3)
        assert server.req("POST", f"/runs/{RUN}/metrics", json=past).status_code == 413
        # sending a batch again (a retry) counts nothing twice
        assert server.req("POST", f"/runs/{RUN}/metrics", json=first).status_code == 200
        assert _counters(server, RUN) == (6, 3)
        # the client's upload shows the refusal; after an admin raises the limit, the upload completes
        run = track.create_run(name="wide", home=tmp_path / "store")
        run.log("train", {f"m{i}": float(i) for i in range(5)}, step=0)
        run.finish()
        client = Client(Credentials("http://testserver", server.keys["alice"]), http=server.client)
        with pytest.raises(UploadError, match=r"metrics -> 413: .*over the server's limit of 3 per run"):
            upload_run(run.path, client=client)
        app = server.client.app
        app.state.settings = dataclasses.replace(app.state.settings, max_run_metrics=None)
        upload_run(run.path, client=client)
        assert _counters(server, run.id) == (5, 5)
        # points count in the owner's quota: alice holds 6 + 5; with room for 13, 3 more are refused whole
        app.state.settings = dataclasses.replace(app.state.settings, quota_bytes=13 * POINT_BYTES)
        more = _batch(20, [5, 6, 7], {"loss": [1.0] * 3})
        refused = server.req("POST", f"/runs/{RUN}/metrics", json=more)
        assert refused.status_code == 413 and "--quota-mb" in refused.json()["detail"]
        assert f"metric points ({POINT_BYTES} bytes each)" in refused.json()["detail"]
        assert _counters(server, RUN) == (6, 3)
        fits = _batch(20, [5, 6], {"loss": [1.0] * 2})
        assert server.req("POST", f"/runs/{RUN}/metrics", json=fits).status_code == 200
        with server.client.app.state.sessions() as session:
            alice = session.scalars(select(User.id).where(User.name == "alice")).one()
            assert usage(session, alice) == 13 * POINT_BYTES
        assert server.req("DELETE", f"/runs/{RUN}").status_code == 200  # in the trash, its points still count
        with server.client.app.state.sessions() as session:
            assert usage(session, alice) == 13 * POINT_BYTES
        assert server.req("DELETE", f"/runs/{RUN}", params={"purge": "true"}).status_code == 200  # gone: given back
        with server.client.app.state.sessions() as session:
            assert usage(session, alice) == 5 * POINT_BYTES
    server.client.app.state.engine.dispose()


def test_migration_0012_counts_the_points_and_metrics_of_existing_runs(db_url: str) -> None:
    from ember.server.storage.db import make_engine, migrate

    alembic_to(db_url, "0011")
    engine = make_engine(db_url)
    t = "'2026-01-01 00:00:00'"
    with engine.begin() as conn:
        conn.execute(text(f"INSERT INTO users (id, name, is_admin, created) VALUES (1, 'alice', TRUE, {t})"))
        conn.execute(
            text(f"INSERT INTO folders (id, path, parent_id, owner_id, created) VALUES (1, '/alice', NULL, 1, {t})")
        )
        for pk, run_id in ((1, RUN), (2, "d4" * 16)):
            conn.execute(
                text(
                    "INSERT INTO runs (pk, id, folder_id, owner_id, name, status, labels, description, hparams, meta, "
                    f"platform, uploaded) VALUES ({pk}, '{run_id}', 1, 1, 'r', 'Complete', '[]', '', '{{}}', '{{}}', "
                    f"'{{}}', {t})"
                )
            )
        points = [("train", "loss", s) for s in range(5)] + [("train", "acc", 0), ("val", "loss", 0)]
        for type_, name, step in points:
            conn.execute(
                text("INSERT INTO metric_points (run_pk, type, name, step, time, value) VALUES (1, :t, :n, :s, 0, 1)"),
                {"t": type_, "n": name, "s": step},
            )
    migrate(engine)
    engine.dispose()
    plain = create_engine(db_url)
    with plain.connect() as conn:
        rows = conn.execute(text("SELECT pk, metric_points, metric_names FROM runs ORDER BY pk")).all()
    plain.dispose()
    assert [tuple(r) for r in rows] == [(1, 7, 3), (2, 0, 0)]


def test_a_users_runs_and_folders_are_bounded_whoever_makes_them(tmp_path: Path, db_url: str) -> None:
    server = make_server(tmp_path, db_url, max_user_runs=2, max_user_folders=4)
    with server.client:
        server.add_user("bob")
        # alice's tree holds /alice; /alice/a/b makes 2 more, /alice/c a 4th; a 5th is refused
        made = server.req("POST", "/folders", json={"path": "a/b", "parents": True})
        assert made.status_code == 200
        assert server.req("POST", "/folders", json={"path": "c"}).status_code == 200
        refused = server.req("POST", "/folders", json={"path": "d/e", "parents": True})
        assert refused.status_code == 413
        assert "tree of 'alice' would hold 6 folders, over the server's limit of 4" in refused.json()["detail"]
        assert "--max-user-folders" in refused.json()["detail"]
        assert server.req("GET", "/folders", params={"path": "/alice/d"}).status_code == 404  # none of it made
        # runs: two fit; a third is refused, a run's own update is no new run
        assert _put_run(server, "e1" * 16, folder="a").status_code == 200
        assert _put_run(server, "e2" * 16, folder="a/b").status_code == 200
        assert _put_run(server, "e1" * 16, folder="a").status_code == 200
        third = _put_run(server, "e3" * 16, folder="c")
        assert third.status_code == 413 and "would hold 3 runs, over the server's limit of 2" in third.text
        assert "--max-user-runs" in third.json()["detail"]
        assert server.req("GET", f"/runs/{'e3' * 16}").status_code == 404
        # a run in a new folder past the folder limit makes neither
        assert server.req("DELETE", f"/runs/{'e2' * 16}", params={"purge": "true"}).status_code == 200
        past = _put_run(server, "e4" * 16, folder="x/y")
        assert past.status_code == 413 and "--max-user-folders" in past.text
        assert server.req("GET", f"/runs/{'e4' * 16}").status_code == 404
        # bob's tree is his own count; an editor's runs in alice's tree count in hers
        assert _put_run(server, "e5" * 16, folder="mine", user="bob").status_code == 200
        grant = {"kind": "folder", "target": "/alice/c", "grantee": "bob", "level": "edit"}
        assert server.req("PUT", "/shares", json=grant).status_code == 200
        assert _put_run(server, "e6" * 16, folder="/alice/c", user="bob").status_code == 200
        assert _put_run(server, "e7" * 16, folder="/alice/c", user="bob").status_code == 413
        # the client's upload shows the refusal
        run = track.create_run(name="more", home=tmp_path / "store")
        run.finish()
        client = Client(Credentials("http://testserver", server.keys["alice"]), http=server.client)
        with pytest.raises(UploadError, match=r"PUT /runs/\w+ -> 413: .*--max-user-runs"):
            upload_run(run.path, folder="c", client=client)
    server.client.app.state.engine.dispose()


def test_concurrent_new_runs_never_take_a_user_past_the_limit(tmp_path: Path, db_url: str) -> None:
    """Eight runs sent at once against a limit of 3: exactly 3 made, 5 refused. Before, on
    PostgreSQL each request counted the owner's runs before any had committed, and all were made."""
    server = make_server(tmp_path, db_url, max_user_runs=3)
    with server.client:
        assert server.req("POST", "/folders", json={"path": "race"}).status_code == 200
        start = threading.Barrier(8)

        def put(i: int) -> int:
            start.wait()
            return int(_put_run(server, f"{i:032x}", folder="race").status_code)

        with ThreadPoolExecutor(8) as pool:
            codes = sorted(pool.map(put, range(8)))
        assert codes == [200] * 3 + [413] * 5, codes
        listed = server.req("GET", "/search/runs", params={"per_page": 50}).json()
        assert listed["total"] == 3
    server.client.app.state.engine.dispose()


def test_the_count_limits_come_from_flags_or_the_environment_and_0_is_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ember.server.storage import settings as server_settings
    from ember.server.storage.settings import ServerError, Settings

    for name in dir(server_settings):  # unset (""), and restored after the test: export_env writes them all
        if name.startswith("ENV_"):
            monkeypatch.setenv(getattr(server_settings, name), "")
    plain = Settings.make(data_dir=tmp_path)
    assert (plain.max_user_runs, plain.max_user_folders, plain.max_run_metrics) == (100_000, 100_000, 10_000)
    monkeypatch.setenv("EMBER_SERVER_MAX_USER_RUNS", "7")
    monkeypatch.setenv("EMBER_SERVER_MAX_RUN_METRICS", "0")
    given = Settings.make(data_dir=tmp_path, max_user_folders=0)
    assert (given.max_user_runs, given.max_user_folders, given.max_run_metrics) == (7, None, None)
    given.export_env()  # what `ember server` hands its workers
    assert Settings.make(data_dir=tmp_path) == given
    with pytest.raises(ServerError, match="max_run_metrics must be 0 \\(no limit\\) or more, got -1"):
        Settings.make(data_dir=tmp_path, max_run_metrics=-1)
