"""The artifact page previews hostile files as "not previewed" with the reason, never a 500 (issue 30, item 4):
JSON nested deeper than Python recurses, a CSV the reader refuses, a small image claiming a huge
picture, an image whose size cannot be read; and a run image claiming a size no client makes is refused."""

from __future__ import annotations

import base64
import hashlib
import re
import struct
import zlib

from tests.server.conftest import Server

ART = "f" * 32


def _png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0\0")) + chunk(b"IEND", b"")


FILES = {
    "deep.json": (b"[" * 100_000, "JSON nested too deeply to show"),
    "deep-closed.json": (b"[" * 5_000 + b"]" * 5_000, "JSON nested too deeply to show"),
    "nul.csv": (b"a,b\n" * 3_000 + b"c,\x00\n", "binary (it holds NUL bytes)"),
    "quote.csv": (b'a,"b\nc' * 10, None),
    "bomb.png": (_png(100_000, 100_000), "an image of 100000 x 100000 pixels"),
    "cut.jpg": (b"\xff\xd8\xff\xe0\xff\xff" + b"\0" * 100, "its size as an image is not in its first 64 KiB"),
    "long-number.json": (b"1" * 5_000, None),
    "ok.png": (_png(2, 2), None),
}


def test_hostile_files_are_shown_as_not_previewed_with_the_reason_and_huge_run_images_refused(server: Server) -> None:
    files = []
    for path, (data, _) in FILES.items():
        sha = hashlib.sha256(data).hexdigest()
        assert server.req("PUT", f"/blobs/{sha}", content=data).status_code == 200
        files.append({"path": path, "size": len(data), "sha256": sha})
    art = {"id": ART, "name": "hostile", "files": files}
    assert server.req("PUT", f"/artifacts/{ART}", json={"artifact": art}).status_code == 200
    server.console_login()
    page = server.client.get(f"/ui/artifacts/{ART}")
    assert page.status_code == 200, page.text[:500]  # deep.json made it a 500 for everyone
    notes = dict(
        re.findall(
            r'class="muted small not-previewed" data-path="([^"]+)"><span class="mono">[^<]*</span>: ([^<]*)<',
            page.text,
        )
    )
    for path, (_, reason) in FILES.items():
        if reason is None:
            assert path not in notes, (path, notes.get(path))
        else:
            assert reason in notes.get(path, ""), (path, notes.get(path))
    assert 'data-path="ok.png" data-kind="image"' in page.text
    assert 'data-path="long-number.json" data-kind="text"' in page.text  # not JSON Python reads: as text
    assert 'data-path="quote.csv" data-kind="csv"' in page.text
    images = {
        p: server.client.get(f"/ui/artifacts/{ART}/preview/{p}").status_code for p in ("bomb.png", "cut.jpg", "ok.png")
    }
    assert images == {"bomb.png": 415, "cut.jpg": 415, "ok.png": 200}
    # and a run image claiming a size no client makes is refused
    run_id = "e" * 32
    body = {"run": {"id": run_id, "name": "gan", "status": "Running"}}
    assert server.req("PUT", f"/runs/{run_id}", json=body).status_code == 200
    for size, status in (((0, 5), 422), ((16_385, 2), 422), ((2, 100_000), 422), ((4, 4), 200)):
        line = {"name": "x", "step": size[0], "time": 1.0, "png": base64.b64encode(_png(*size)).decode()}
        cursor = server.req("GET", f"/runs/{run_id}").json()["cursors"].get("images.jsonl", 0)
        sent = server.req("POST", f"/runs/{run_id}/images", json={"start": cursor, "end": cursor + 1, "images": [line]})
        assert sent.status_code == status, (size, sent.text)
