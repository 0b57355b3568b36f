"""Lineage beyond the direct neighbours (issue 33, item 9): ``GET /runs/{id}?depth=`` walks the
upstream and downstream graph level by level, ends on a cycle, keeps a diamond's node once,
counts what its caps leave out and what the viewer may not see, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event

from ember.server.services import edges
from tests.console._data import BRANCH, CHAIN, lineage_graph
from tests.server.conftest import Server


def _send(server: Server, user: str = "alice") -> Any:
    return lambda method, path, body: server.req(method, path, user=user, json=body).status_code


def _lineage(server: Server, node: str, depth: str, user: str = "alice") -> tuple[dict[str, int], set[tuple], Any]:
    got = server.req("GET", f"/runs/{node}", user=user, params={"depth": depth})
    assert got.status_code == 200, got.text
    body = got.json()
    levels = {n["id"]: n["level"] for n in body["lineage_levels"]}
    pairs = {(e["source"]["id"], e["target"]["id"]) for e in body["lineage"]}
    assert len(pairs) == len(body["lineage"])  # each edge once, a cycle's included
    return levels, pairs, body


def test_depth_walks_the_chain_ends_on_the_cycle_and_reports_its_caps(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = lineage_graph(_send(server))
    s1, s2, s3, s4, s5 = CHAIN
    everything = {(s1, s2), (s2, s3), (s3, s4), (s4, s5), (s3, BRANCH), (s5, s3)}
    # depth 1 (the default): the neighbours only, as before; step-5 is an input of step-3 (the cycle)
    levels, pairs, body = _lineage(server, s3, "1")
    assert levels == {s3: 0, s2: -1, s5: -1, s4: 1, BRANCH: 1}
    assert pairs == {(s2, s3), (s3, s4), (s3, BRANCH), (s5, s3)} and body["lineage_depth"] == 1
    assert server.req("GET", f"/runs/{s3}", params={}).json()["lineage_levels"] == body["lineage_levels"]
    # depth 2 reaches step-1 upstream and step-5 downstream; step-4 is also step-5's input (level -2)
    levels, pairs, _ = _lineage(server, s3, "2")
    assert levels == {s3: 0, s2: -1, s5: -1, s4: 1, BRANCH: 1, s1: -2}
    assert pairs == everything
    # all: the whole graph once, the cycle walked round once and ended
    for node in (s1, s3, BRANCH):
        levels, pairs, body = _lineage(server, node, "all")
        assert set(levels) == set(ids.values()) and pairs == everything
        assert body["lineage_more"] == 0 and body["lineage_hidden"] == 0 and body["lineage_depth"] == "all"
    levels, _, _ = _lineage(server, s1, "all")
    assert levels == {s1: 0, s2: 1, s3: 2, s4: 3, BRANCH: 3, s5: 4}
    levels, pairs, _ = _lineage(server, BRANCH, "3")  # upstream only: step-3, then step-2 and step-5, ...
    assert levels == {BRANCH: 0, s3: -1, s2: -2, s5: -2, s1: -3, s4: -3}

    # a level is a bounded number of queries however many nodes it holds (never one query a node)
    statements: list[str] = []
    engine = server.client.app.state.read_engine  # GETs read on it
    listen = lambda *a: statements.append(a[2])  # noqa: E731
    event.listen(engine, "before_cursor_execute", listen)
    try:
        _lineage(server, s1, "all")
    finally:
        event.remove(engine, "before_cursor_execute", listen)
    walked = [s for s in statements if "FROM lineage" in s]
    assert len(walked) == 2 * 5  # counts and edges for 4 levels, and a 5th finding none

    # bob, who sees none of these, writes an edge from his private run onto step-1: counted, not shown
    private = "9" * 32
    run = {"id": private, "name": "bobs", "status": "Complete"}
    assert _send(server, "bob")("PUT", f"/runs/{private}", {"folder": "p", "make_folder": True, "run": run}) == 200
    edge = {"time": 9.0, "source": {"kind": "run", "id": private, "name": "x"}}
    edge["target"] = {"kind": "run", "id": s1, "name": "y"}
    assert _send(server, "bob")("POST", f"/runs/{private}/lineage", {"start": 0, "end": 1, "edges": [edge]}) == 200
    levels, pairs, body = _lineage(server, s3, "all")
    assert private not in levels and pairs == everything and body["lineage_hidden"] == 1
    assert _lineage(server, s3, "1")[2]["lineage_hidden"] == 0  # step-1 is two levels away

    # the caps: the walk stops, and says how many edges it found and left out
    monkeypatch.setattr(edges, "MAX_NODES", 3)
    levels, pairs, body = _lineage(server, s1, "all")
    assert levels == {s1: 0, s2: 1, s3: 2} and pairs == {(s1, s2), (s2, s3)} and body["lineage_more"] == 2
    monkeypatch.setattr(edges, "MAX_NODES", 300)
    monkeypatch.setattr(edges, "MAX_EDGES", 4)
    levels, pairs, body = _lineage(server, s3, "all")
    assert len(pairs) == 4 and body["lineage_more"] == 2  # level 1's four edges; level 2's two left out

    # the artifact route reads the same depth; a depth that is not one is a 422 naming it
    for bad in ("0", "-1", "deep"):
        got = server.req("GET", f"/runs/{s3}", params={"depth": bad})
        assert got.status_code == 422 and "depth" in got.json()["detail"], got.text
    assert server.req("GET", f"/artifacts/{'a' * 32}", params={"depth": "x"}).status_code in (404, 422)
