"""Runs and artifacts are two kinds of node (issue 30, item 2): an id one kind holds is refused to the
other, cursors and lineage are keyed by (kind, id), a delete removes only its own node's rows, and
migration 0008 fixes a database where both kinds already share an id."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from tests.server.conftest import Server, alembic_to

V = "5" * 32  # bob's run
W = "6" * 32


def _run(server: Server, user: str, run_id: str, folder: str = "mine") -> Any:
    body = {"folder": folder, "make_folder": True, "run": {"id": run_id, "name": "r", "status": "Running"}}
    return server.req("PUT", f"/runs/{run_id}", user=user, json=body)


def _artifact(server: Server, user: str, artifact_id: str) -> Any:
    data = f"{user} weights".encode()
    sha = hashlib.sha256(data).hexdigest()
    assert server.req("PUT", f"/blobs/{sha}", user=user, content=data).status_code == 200
    art = {"id": artifact_id, "name": "model", "files": [{"path": "w", "size": len(data), "sha256": sha}]}
    return server.req("PUT", f"/artifacts/{artifact_id}", user=user, json={"artifact": art})


def _edge(source: tuple[str, str], target: tuple[str, str]) -> dict[str, Any]:
    return {
        "time": 1.0,
        "source": {"kind": source[0], "id": source[1], "name": "s"},
        "target": {"kind": target[0], "id": target[1], "name": "t"},
    }


def test_an_id_held_by_one_kind_is_refused_to_the_other_and_rows_are_keyed_by_kind(server: Server) -> None:
    assert _run(server, "bob", V).status_code == 200
    share = {"kind": "run", "target": V, "grantee": "carol", "level": "view"}
    assert server.req("PUT", "/shares", user="bob", json=share).status_code == 200
    # carol sees bob's run V; an artifact of her own with V's id is refused (it used to be made)
    taken = _artifact(server, "carol", V)
    assert taken.status_code == 409, taken.text
    assert f"the id {V} is taken by a run: an artifact needs an id of its own" in taken.json()["detail"]
    assert _artifact(server, "carol", W).status_code == 200
    refused = _run(server, "bob", W)
    assert refused.status_code == 409 and f"the id {W} is taken by an artifact: a run needs" in refused.json()["detail"]
    # nothing of either was made, and each keeps its own
    assert server.req("GET", f"/runs/{W}", user="bob").status_code == 404
    assert server.req("GET", f"/artifacts/{V}", user="carol").status_code == 404
    assert server.req("GET", f"/runs/{V}", user="bob").json()["cursors"] == {}
    assert server.req("DELETE", f"/artifacts/{W}", user="carol").status_code == 200
    _keyed_by_kind(server)


def _collide(server: Server) -> None:
    """Make carol an artifact with the id of bob's run V, as a server before issue 30 let her."""
    assert _artifact(server, "carol", W).status_code == 200
    with server.client.app.state.engine.begin() as conn:
        conn.execute(text("UPDATE artifacts SET id = :v WHERE id = :w"), {"v": V, "w": W})


def _keyed_by_kind(server: Server) -> None:
    """Cursors and lineage are keyed by kind, and a delete removes only its own node's rows."""
    log = {"start": 0, "end": 6, "text": "hello\n"}
    assert server.req("POST", f"/runs/{V}/log", user="bob", json=log).status_code == 200
    mine = {"start": 0, "end": 10, "edges": [_edge(("run", V), ("artifact", "7" * 32))]}
    assert server.req("POST", f"/runs/{V}/lineage", user="bob", json=mine).json() == {"cursor": 10}
    _collide(server)
    # carol's artifact V posts lineage with a cursor far ahead, and an edge that claims bob's run V
    forged = {
        "start": 0,
        "end": 10**12,
        "edges": [_edge(("run", V), ("artifact", V)), _edge(("artifact", V), ("run", "8" * 32))],
    }
    assert server.req("POST", f"/artifacts/{V}/lineage", user="carol", json=forged).json() == {"cursor": 10**12}
    # an edge that names V only as a run is not the artifact's to send
    claim = {"start": 10**12, "end": 10**12 + 1, "edges": [_edge(("run", V), ("run", "8" * 32))]}
    refused = server.req("POST", f"/artifacts/{V}/lineage", user="carol", json=claim)
    assert refused.status_code == 422 and "must have that artifact as its source or target" in refused.text
    bobs = server.req("GET", f"/runs/{V}", user="bob").json()
    assert bobs["cursors"] == {"stdout.log": 6, "lineage.jsonl": 10}
    # his own edge and the one claiming run V (its other end carol's artifact, which he may not view): both hidden
    assert bobs["lineage"] == [] and bobs["lineage_hidden"] == 2
    # bob's uploader goes on from its own cursor: his next lineage line is stored
    more = {"start": 10, "end": 20, "edges": [_edge(("run", V), ("artifact", "9" * 32))]}
    assert server.req("POST", f"/runs/{V}/lineage", user="bob", json=more).json() == {"cursor": 20}
    carols = server.req("GET", f"/artifacts/{V}", user="carol").json()
    assert carols["cursors"] == {"lineage.jsonl": 10**12}
    # deleting carol's artifact V leaves bob's run V whole
    assert server.req("DELETE", f"/artifacts/{V}", user="carol").status_code == 200
    assert server.req("GET", f"/runs/{V}", user="bob").json()["cursors"] == {"stdout.log": 6, "lineage.jsonl": 20}


def test_migration_0008_gives_each_cursor_its_kind_and_drops_the_ambiguous_ones(db_url: str, tmp_path: Path) -> None:
    from ember.server.storage.db import make_engine, migrate

    alembic_to(db_url, "0007")
    engine = make_engine(db_url)
    t = "'2026-01-01 00:00:00'"
    run_only, art_only, both, gone = "1" * 32, "2" * 32, "3" * 32, "4" * 32
    with engine.begin() as conn:
        conn.execute(text(f"INSERT INTO users (id, name, is_admin, created) VALUES (1, 'bob', TRUE, {t})"))
        conn.execute(
            text(f"INSERT INTO folders (id, path, parent_id, owner_id, created) VALUES (1, '/bob', NULL, 1, {t})")
        )
        for pk, run_id in ((1, run_only), (2, both)):
            conn.execute(
                text(
                    "INSERT INTO runs (pk, id, folder_id, owner_id, name, status, labels, description, hparams, "
                    f"meta, platform, uploaded) VALUES ({pk}, '{run_id}', 1, 1, 'r', 'Complete', '[]', '', '{{}}', "
                    f"'{{}}', '{{}}', {t})"
                )
            )
        for pk, art_id in ((1, art_only), (2, both)):
            conn.execute(
                text(
                    'INSERT INTO artifacts (pk, id, folder_id, owner_id, name, labels, description, "references", '
                    f"uploaded) VALUES ({pk}, '{art_id}', 1, 1, 'a', '[]', '', '[]', {t})"
                )
            )
        cursors = [
            (run_only, "stdout.log", 5),
            (run_only, "lineage.jsonl", 6),
            (art_only, "lineage.jsonl", 7),
            (both, "metrics/train.jsonl", 8),
            (both, "lineage.jsonl", 10**12),
            (gone, "stdout.log", 9),
        ]
        for node, stream, offset in cursors:
            conn.execute(
                text('INSERT INTO cursors (node_id, stream, "offset") VALUES (:n, :s, :o)'),
                {"n": node, "s": stream, "o": offset},
            )
        edge = "INSERT INTO lineage (source_kind, source_id, source_name, target_kind, target_id, target_name, time)"
        conn.execute(text(f"{edge} VALUES ('run', '{both}', 'r', 'artifact', '{art_only}', 'a', 1.0)"))
    migrate(engine)
    engine.dispose()
    plain = create_engine(db_url)
    with plain.begin() as conn:
        got = sorted(tuple(r) for r in conn.execute(text('SELECT node_kind, node_id, stream, "offset" FROM cursors')))
        assert got == sorted(
            [
                ("run", run_only, "stdout.log", 5),
                ("run", run_only, "lineage.jsonl", 6),
                ("artifact", art_only, "lineage.jsonl", 7),
                ("run", both, "metrics/train.jsonl", 8),
            ]
        )
        # an edge that differs only by its ends' kinds is another edge now
        conn.execute(text(f"{edge} VALUES ('artifact', '{both}', 'a', 'artifact', '{art_only}', 'a', 2.0)"))
        assert conn.execute(text("SELECT count(*) FROM lineage")).scalar_one() == 2
    plain.dispose()
