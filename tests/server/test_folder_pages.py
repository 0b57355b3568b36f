"""``GET /api/v1/folders`` answers a page at a time (issue 18, item 13), on SQLite and PostgreSQL.

Before: it answered every run of a folder (1.1 s and 1.65 MB at 10,000 runs) and ignored a
limit. Now each answer holds at most ``limit`` sub-folders, runs and artifacts and a
``next_page_token`` that continues them; the console's folder page follows the same pages.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest
from sqlalchemy import event, text

from tests.server.conftest import Server

START = "2026-01-01T00:00:0{}+00:00"


def _run(server: Server, i: int, start: str | None, folder: str = "f") -> str:
    run_id = f"{i + 1:032x}"
    run = {"id": run_id, "name": f"run{i}", "status": "Complete", "start_time": start, "hparams": {"i": i}}
    body = {"folder": folder, "make_folder": True, "run": run}
    assert server.req("PUT", f"/runs/{run_id}", json=body).status_code == 200
    return run_id


def _artifact(server: Server, i: int) -> None:
    data = f"bytes {i}".encode()
    sha = hashlib.sha256(data).hexdigest()
    assert server.req("PUT", f"/blobs/{sha}", content=data).status_code == 200
    meta = {"id": f"{i + 1:032x}", "name": f"art{i % 3}", "files": [{"path": "w", "size": len(data), "sha256": sha}]}
    assert server.req("PUT", f"/artifacts/{meta['id']}", json={"folder": "f", "artifact": meta}).status_code == 200


@pytest.fixture
def folder(server: Server) -> dict[str, Any]:
    """/alice/f: 8 runs (three started at the same time, one without a start), 5 artifacts, 4 sub-folders."""
    starts = [START.format(1), START.format(2), START.format(2), START.format(2), START.format(3), None]
    ids = [_run(server, i, start) for i, start in enumerate(starts)]
    ids += [_run(server, 6, START.format(5)), _run(server, 7, START.format(4))]
    for i in range(5):
        _artifact(server, 10 + i)
    for sub in ("d", "a", "c", "b"):
        assert server.req("POST", "/folders", json={"path": f"f/{sub}"}).status_code == 200
    # Newest first; the same start time by upload order, newest upload first; no start time last.
    newest = [ids[i] for i in (6, 7, 4, 3, 2, 1, 0, 5)]
    return {"runs": newest, "artifacts": 5}


def _pages(server: Server, limit: int, path: str = "/alice/f") -> list[dict[str, Any]]:
    pages, token = [], None
    while True:
        params: dict[str, Any] = {"path": path, "limit": limit, **({"page_token": token} if token else {})}
        answer = server.req("GET", "/folders", params=params)
        assert answer.status_code == 200, answer.text
        pages.append(answer.json())
        token = pages[-1]["next_page_token"]
        if token is None:
            return pages


def test_the_folder_listing_answers_limited_pages_and_a_token_that_continues_them(
    server: Server, folder: dict[str, Any]
) -> None:
    pages = _pages(server, limit=3)
    assert len(pages) == 3  # 8 runs: 3 + 3 + 2
    for page in pages:
        assert len(page["runs"]) <= 3 and len(page["artifacts"]) <= 3 and len(page["folders"]) <= 3
        assert page["path"] == "/alice/f" and page["access"] == "own"
    assert [r["id"] for p in pages for r in p["runs"]] == folder["runs"]  # each once, newest first
    assert [f for p in pages for f in p["folders"]] == [f"/alice/f/{s}" for s in "abcd"]
    artifacts = [(a["name"], a["id"]) for p in pages for a in p["artifacts"]]
    assert len(artifacts) == 5 and [n for n, _ in artifacts] == sorted(n for n, _ in artifacts)
    whole = _pages(server, limit=100)
    assert len(whole) == 1 and [r["id"] for r in whole[0]["runs"]] == folder["runs"]
    assert set(whole[0]["runs"][0]) == {"id", "name", "status", "start_time", "end_time"}


def test_runs_added_between_pages_neither_repeat_nor_push_others_out(server: Server, folder: dict[str, Any]) -> None:
    first = server.req("GET", "/folders", params={"path": "/alice/f", "limit": 4}).json()
    _run(server, 20, START.format(9))  # newer than every listed run: it belongs before the first page
    _run(server, 21, START.format(2))  # a start time shared across the page boundary, uploaded last
    rest = server.req(
        "GET", "/folders", params={"path": "/alice/f", "limit": 100, "page_token": first["next_page_token"]}
    )
    seen = [r["id"] for r in first["runs"] + rest.json()["runs"]]
    assert len(seen) == len(set(seen)) and set(folder["runs"]) <= set(seen)  # OFFSET would repeat one


@pytest.mark.parametrize(
    "params",
    [
        {"limit": 0},
        {"limit": 1001},
        {"page_token": "not base64 json!"},
        {"page_token": "eyJmIjoxfQ"},  # {"f": 1}: not a position of every list
        {"page_token": "W10"},  # []
    ],
)
def test_a_bad_limit_or_token_is_one_clear_error(
    server: Server, folder: dict[str, Any], params: dict[str, Any]
) -> None:
    answer = server.req("GET", "/folders", params={"path": "/alice/f", **params})
    assert answer.status_code == 422
    assert ("page_token" if "page_token" in params else "limit") in answer.json()["detail"]


def test_a_token_works_only_for_its_own_folder(server: Server, folder: dict[str, Any]) -> None:
    token = server.req("GET", "/folders", params={"path": "/alice/f", "limit": 1}).json()["next_page_token"]
    _run(server, 30, START.format(1), folder="g")
    other = server.req("GET", "/folders", params={"path": "/alice/g", "page_token": token})
    assert other.status_code == 422 and "this folder" in other.json()["detail"]
    server.req("PUT", "/shares", json={"kind": "folder", "target": "/alice/f", "grantee": "bob", "level": "view"})
    assert (
        server.req("GET", "/folders", user="bob", params={"path": "/alice/f", "page_token": token}).status_code == 200
    )
    assert (
        server.req("GET", "/folders", user="carol", params={"path": "/alice/f", "page_token": token}).status_code == 404
    )


def test_a_page_is_an_index_range_whatever_the_folder_holds(server: Server, folder: dict[str, Any]) -> None:
    """The indexes of migration 0005 exist, and the statements a first and a later page run read
    runs and artifacts through them (SQLite: no sort of the folder's rows)."""
    engine = server.client.app.state.engine
    with engine.connect() as conn:
        dialect = conn.dialect.name
        query = "SELECT name FROM sqlite_master WHERE type = 'index'" if dialect == "sqlite" else (
            "SELECT indexname FROM pg_indexes")  # fmt: skip
        names = set(conn.execute(text(query)).scalars())
    assert {"ix_runs_folder_start", "ix_artifacts_folder_name"} <= names
    if dialect != "sqlite":
        return
    ran: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT") and (
            "FROM runs" in statement or "FROM artifacts" in statement
        ):
            ran.append((statement, parameters))

    reader = server.client.app.state.read_engine
    event.listen(reader, "before_cursor_execute", record)
    try:
        first = server.req("GET", "/folders", params={"path": "/alice/f", "limit": 2}).json()
        server.req("GET", "/folders", params={"path": "/alice/f", "limit": 2, "page_token": first["next_page_token"]})
    finally:
        event.remove(reader, "before_cursor_execute", record)
    pages = [(q, p) for q, p in ran if "ORDER BY" in q]
    assert len(pages) == 4, ran  # runs and artifacts, on each page
    with engine.connect() as conn:
        for statement, parameters in pages:
            plan = " ".join(str(row[-1]) for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters))
            index = "ix_runs_folder_start" if "FROM runs" in statement else "ix_artifacts_folder_name"
            assert index in plan and "TEMP B-TREE" not in plan, (statement, plan)


def test_the_console_folder_page_follows_the_pages(server: Server, folder: dict[str, Any]) -> None:
    server.console_login()
    url: str | None = "/ui/folders?path=/alice/f&per_page=3"
    shown: list[str] = []
    while url:
        page = server.client.get(url)
        assert page.status_code == 200, page.text[:300]
        shown += re.findall(r'class="run-link" href="/ui/runs/([0-9a-f]{32})"', page.text)
        assert len(re.findall(r'class="run-link"', page.text)) <= 3 and "(8 in this folder" in page.text
        found = re.search(r'href="([^"]+)" rel="next"', page.text)
        url = found.group(1).replace("&amp;", "&") if found else None
    assert shown == folder["runs"]
    bad = server.client.get("/ui/folders", params={"path": "/alice/f", "page_token": "garbage"})
    assert bad.status_code == 422 and "page_token" in bad.text
