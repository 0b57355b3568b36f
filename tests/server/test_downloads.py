"""Downloads (issue 17, item 6): any file name in ``Content-Disposition``; constant memory.

Before: a run name outside Latin-1 made the console's CSV/JSON downloads answer 500, a ``"`` in
it was written into the header unescaped, and a download read every point into memory first
(1,000,000 points took 840 MB of server memory).
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
import tracemalloc
from pathlib import Path
from urllib.parse import unquote

import pytest

from ember.server.services import downloads
from tests.server.conftest import make_server

RUN = "9" * 32
NAME = 'Ωmega "q"; x'


def _filename(disposition: str) -> str:
    """The exact name of an RFC 6266 header: its ``filename*`` (RFC 5987), checked against its fallback."""
    found = re.fullmatch(
        r'attachment; filename="([ -~]*)"; filename\*=UTF-8\'\'([A-Za-z0-9%._~!$&*+^`|-]+)', disposition
    )
    assert found, disposition
    assert '"' not in found.group(1) and "\\" not in found.group(1)
    return unquote(found.group(2), errors="strict")


def test_any_name_downloads_with_an_rfc_6266_file_name(tmp_path: Path) -> None:
    server = make_server(tmp_path, f"sqlite:///{tmp_path / 'server.db'}")
    body = {"folder": "d", "make_folder": True, "run": {"id": RUN, "name": NAME, "status": "Complete"}}
    assert server.req("PUT", f"/runs/{RUN}", json=body).status_code == 200
    batch = {"type": "train", "start": 0, "end": 1, "points": [{"step": 0, "time": 1.0, "metrics": {"x": 2.0}}]}
    assert server.req("POST", f"/runs/{RUN}/metrics", json=batch).status_code == 200
    data = b"bytes"
    sha = hashlib.sha256(data).hexdigest()
    assert server.req("PUT", f"/blobs/{sha}", content=data).status_code == 200
    path = 'dir/"ü"; evil=1.bin'
    art = {"id": "8" * 32, "name": "a", "files": [{"path": path, "size": len(data), "sha256": sha}]}
    assert server.req("PUT", f"/artifacts/{'8' * 32}", json={"artifact": art}).status_code == 200
    server.console_login()
    for url, name in [
        (f"/ui/runs/{RUN}/metrics.csv?type=train", f"{NAME}-train.csv"),
        (f"/ui/runs/{RUN}/metrics.json?type=train", f"{NAME}-train.json"),
        (f"/ui/artifacts/{'8' * 32}/files/{path}", '"ü"; evil=1.bin'),
        (f"/api/v1/artifacts/{'8' * 32}/files/{path}", '"ü"; evil=1.bin'),
    ]:
        headers = server.h() if url.startswith("/api") else {}
        r = server.client.get(url, headers=headers)
        assert r.status_code == 200, (url, r.status_code, r.text[:200])
        disposition = r.headers["content-disposition"]
        assert disposition.isascii() and disposition.count('"') == 2, disposition
        assert _filename(disposition) == name, disposition
    assert server.client.get(f"/ui/runs/{RUN}/metrics.json?type=train").json()["points"][0]["metrics"] == {"x": 2.0}


@pytest.mark.parametrize("form", ["csv", "json"])
def test_a_download_streams_in_constant_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    monkeypatch.setattr(downloads, "BATCH", 1000)
    server = make_server(tmp_path, f"sqlite:///{tmp_path / 'server.db'}")
    body = {"folder": "d", "make_folder": True, "run": {"id": RUN, "name": "big", "status": "Complete"}}
    assert server.req("PUT", f"/runs/{RUN}", json=body).status_code == 200
    batch = {
        "type": "train",
        "start": 0,
        "end": 1,
        "points": [{"step": 0, "time": 1.0, "metrics": {"a": 0.0, "b": 0.0}}],
    }
    assert server.req("POST", f"/runs/{RUN}/metrics", json=batch).status_code == 200
    steps = 25_000
    db = sqlite3.connect(tmp_path / "server.db")
    rows = [(s, n, s / 100, 1.0, s * 0.5) for s in range(1, steps) for n in ("a", "b")]
    db.executemany(
        "INSERT INTO metric_points (run_pk, type, step, name, epoch, time, value) VALUES (1, 'train', ?, ?, ?, ?, ?)",
        rows,
    )
    db.commit()
    db.close()
    del rows
    app = server.client.app
    with app.state.sessions() as session:
        app.state.series.refresh(session, 1, RUN, "train")
    url = f"/api/v1/runs/{RUN}/metrics{'.csv' if form == 'csv' else ''}?type=train"
    tracemalloc.start()
    try:
        with server.client.stream("GET", url, headers=server.h()) as r:
            size = sum(len(chunk) for chunk in r.iter_bytes())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.status_code == 200 and size > 1_000_000
    print(f"{form}: {2 * steps} points, {size} bytes, peak {peak / 1e6:.1f} MB")
    assert peak < 5e6, f"{peak / 1e6:.1f} MB"  # reading every point first took 17-29 MB here
