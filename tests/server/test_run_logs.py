"""A run's output (issue 30, item 1): bounded per run and counted in the quota (413, nothing kept),
stored in pieces by line so the run page, its live refresh and a search read a bounded window
whatever the log's size, the API's text and the download in pieces; migration 0010 re-stores
existing logs."""

from __future__ import annotations

import hashlib
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from ember.server.services import logs
from tests.server.conftest import Server, alembic_to, make_server

RUN, RUN2 = "d" * 32, "d2" * 16
MiB = 1 << 20


def _run(server: Server, run_id: str = RUN, user: str = "alice") -> None:
    body = {"folder": "logs", "make_folder": True, "run": {"id": run_id, "name": "talky", "status": "Running"}}
    assert server.req("PUT", f"/runs/{run_id}", user=user, json=body).status_code == 200


def _send(server: Server, start: int, body: str, run_id: str = RUN, status: int = 200) -> Any:
    end = start + len(body.encode())
    r = server.req("POST", f"/runs/{run_id}/log", json={"start": start, "end": end, "text": body})
    assert r.status_code == status, r.text[:300]
    return r.json()


def test_a_runs_output_is_bounded_per_run_and_counted_in_the_quota(tmp_path: Path, db_url: str) -> None:
    srv = make_server(tmp_path, db_url, max_log_bytes=10_000, quota_bytes=25_000)
    with srv.client:
        _run(srv)
        assert _send(srv, 0, "x" * 6_000 + "\n") == {"cursor": 6_001}
        over = _send(srv, 6_001, "é" * 2_000 + "\n", status=413)  # 4,001 bytes more: 10,002 > 10,000
        assert "10002 bytes, over the server's limit of 10000 bytes per run" in over["detail"]
        assert "ember server --max-log-mb" in over["detail"]
        run = srv.req("GET", f"/runs/{RUN}").json()
        assert run["cursors"]["stdout.log"] == 6_001  # nothing of the refused text is kept
        assert srv.req("GET", f"/runs/{RUN}/log").json()["text"] == "x" * 6_000 + "\n"
        # the output counts in the owner's quota, with artifact files
        blob = b"b" * 15_000
        sha = hashlib.sha256(blob).hexdigest()
        assert srv.req("PUT", f"/blobs/{sha}", content=blob).status_code == 200  # 6,001 + 15,000
        _run(srv, "e" * 32)
        refused = _send(srv, 0, "y" * 5_000, run_id="e" * 32, status=413)  # 26,001 > 25,000
        assert "run output held by 'alice', over the quota of 25000 bytes" in refused["detail"]
        assert "ember server --quota-mb" in refused["detail"]
        assert srv.req("GET", f"/runs/{'e' * 32}").json()["cursors"].get("stdout.log", 0) == 0
        assert srv.req("DELETE", f"/runs/{RUN}?purge=true").status_code == 200  # deleting the run frees its output
        assert _send(srv, 0, "y" * 5_000, run_id="e" * 32) == {"cursor": 5_000}
    srv.client.app.state.engine.dispose()


def _lines(count: int, start: int = 0) -> str:
    return "".join(f"line {i} {'needle' if i % 1000 == 7 else 'hay'}\n" for i in range(start, start + count))


def _peak(action: Any) -> int:
    """The most memory Python allocated while ``action`` ran (allocations, not time: deterministic)."""
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_run_page_its_live_refresh_and_a_search_read_a_window_whatever_the_logs_size(server: Server) -> None:
    _run(server)
    total = 120_000  # ~ 2 MB of short lines; an attacker's 60 MB went the same way
    first = _lines(total // 2)
    cursor = _send(server, 0, first)["cursor"]
    _send(server, cursor, _lines(total // 2, total // 2) + "no newline yet")
    server.console_login()
    page = f"/ui/runs/{RUN}"
    server.client.get(page)  # templates compiled, caches warm: what is measured is the request's own work

    def live() -> None:
        answer = server.client.get(f"{page}/live").json()
        assert answer["total_lines"] == total + 1
        assert answer["lines"] == [
            f"line {i} {'needle' if i % 1000 == 7 else 'hay'}" for i in range(total - 199, total)
        ] + ["no newline yet"]

    def tail_page() -> None:
        body = server.client.get(page).text
        assert "(120,001 lines, last 200)" in body and "line 119999 hay" in body and "line 119799 hay" not in body

    def window() -> None:
        body = server.client.get(page, params={"log_from": 90_001}).text  # 1-based: line 90000 on
        assert "lines 90,001–90,200 of 120,001" in body
        assert "line 90000 hay\nline 90001 hay" in body and "line 90200 hay" not in body
        assert "?log_from=89801" in body and "?log_from=90201" in body  # earlier, later

    def search() -> None:
        body = server.client.get(page, params={"log_q": "NEEDLE"}).text
        assert "120 lines contain “NEEDLE”" in body and "line 119007 needle" in body

    for action in (live, tail_page, window, search):
        peak = _peak(action)
        # reading the whole 2 MB log and splitting it took over 10 MB; a window is a few pieces
        assert peak < 4 * MiB, (action.__name__, peak)


def test_a_long_search_goes_on_where_it_stopped_and_the_apis_text_and_the_download_come_in_pieces(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs, "SEARCH_BYTES", 3 * logs.PIECE_CHARS)  # a search reads ~3 pieces a request
    _run(server)
    long = "z" * (logs.PIECE_CHARS + 10) + " needle-across\n"  # one line over two pieces
    body = _lines(30_000) + long + _lines(5_000, 30_001)
    _send(server, 0, body)
    found = []
    before = None
    for _ in range(20):
        with server.client.app.state.read_sessions() as session:
            view = logs.search(session, server_run_pk(server), "needle", before)
        found = [n for n, _ in view.hits] + found
        if view.searched_from == 0:
            break
        assert view.until == (before if before is not None else 35_001) and view.searched_from < view.until
        before = view.searched_from
    expected = [i for i in range(35_001) if i != 30_000 and i % 1000 == 7] + [30_000]
    assert sorted(found) == sorted(expected)
    with server.client.app.state.read_sessions() as session:
        cut = logs.window(session, server_run_pk(server), 30_000, 2)
        assert cut.lines[0].endswith(" more characters]") and cut.lines[1] == "line 30001 hay"
    _pieces(server, monkeypatch)


def server_run_pk(server: Server, run_id: str = RUN) -> int:
    with server.client.app.state.engine.connect() as conn:
        return int(conn.execute(text("SELECT pk FROM runs WHERE id = :id"), {"id": run_id}).scalar_one())


def _pieces(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """The API's text and the download come in pieces and are the whole output."""
    monkeypatch.setattr(logs, "TEXT_BYTES", 2 * logs.PIECE_CHARS)
    _run(server, RUN2)
    body = "".join(f"ünïcode {i}\n" for i in range(40_000))  # ~0.5 MB, pieces of 65,536 characters
    sent = 0
    for part in (body[:100_001], body[100_001:]):  # a request ending mid-line continues the last piece
        sent = _send(server, sent, part, run_id=RUN2)["cursor"]
    pages, offset = [], 0
    while offset is not None:
        answer = server.req("GET", f"/runs/{RUN2}/log", params={"offset": offset}).json()
        assert answer["offset"] == offset and len(answer["text"].encode()) <= logs.TEXT_BYTES + 4 * logs.PIECE_CHARS
        pages.append(answer["text"])
        offset = answer["next_offset"]
    assert len(pages) > 2 and "".join(pages) == body
    server.console_login()
    download = server.client.get(f"/ui/runs/{RUN2}/output.log")
    assert download.text == body and "attachment" in download.headers["content-disposition"]
    with server.client.app.state.engine.connect() as conn:
        pk = {"pk": server_run_pk(server, RUN2)}
        pieces = 'SELECT start, "end", line, newlines FROM log_pieces WHERE run_pk = :pk ORDER BY start'
        rows = conn.execute(text(pieces), pk).all()
        size = conn.execute(text("SELECT log_bytes FROM runs WHERE pk = :pk"), pk).scalar_one()
    assert size == len(body.encode()) == rows[-1][1]
    assert [r[2] for r in rows] == [sum(r[3] for r in rows[:i]) for i in range(len(rows))]


def test_migration_0010_stores_existing_logs_in_pieces(db_url: str) -> None:
    from ember.server.storage.db import make_engine, migrate

    alembic_to(db_url, "0009")
    engine = make_engine(db_url)
    t = "'2026-01-01 00:00:00'"
    chunks = ["first ", "line\nsecond é line\n" + "x" * 70_000, "\nthird\n", "no end"]
    with engine.begin() as conn:
        conn.execute(text(f"INSERT INTO users (id, name, is_admin, created) VALUES (1, 'alice', TRUE, {t})"))
        conn.execute(
            text(f"INSERT INTO folders (id, path, parent_id, owner_id, created) VALUES (1, '/alice', NULL, 1, {t})")
        )
        conn.execute(
            text(
                "INSERT INTO runs (pk, id, folder_id, owner_id, name, status, labels, description, hparams, meta, "
                f"platform, uploaded) VALUES (1, '{RUN}', 1, 1, 'r', 'Complete', '[]', '', '{{}}', '{{}}', '{{}}', {t})"
            )
        )
        at = 0
        for chunk in chunks:
            size = len(chunk.encode())
            conn.execute(
                text('INSERT INTO log_chunks (run_pk, start, "end", text) VALUES (1, :s, :e, :t)'),
                {"s": at, "e": at + size, "t": chunk},
            )
            at += size
    migrate(engine)
    engine.dispose()
    whole = "".join(chunks)
    plain = create_engine(db_url)
    with plain.connect() as conn:
        rows = conn.execute(text('SELECT start, "end", line, newlines, text FROM log_pieces ORDER BY start')).all()
        assert conn.execute(text("SELECT log_bytes FROM runs")).scalar_one() == len(whole.encode())
    plain.dispose()
    assert "".join(r[4] for r in rows) == whole
    assert [len(r[4]) for r in rows] == [logs.PIECE_CHARS, len(whole) - logs.PIECE_CHARS]
    assert [(r[0], r[2], r[3]) for r in rows] == [(0, 0, 2), (len(whole[: logs.PIECE_CHARS].encode()), 2, 2)]
