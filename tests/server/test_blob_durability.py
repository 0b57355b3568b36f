"""A received blob is durable once recorded: BlobStore.place fsyncs the file, renames it, fsyncs its folder."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from ember.server.services.blobs import BlobStore


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="tells a folder's fd from a file's through /proc")
def test_placing_a_blob_fsyncs_it_renames_it_and_fsyncs_its_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = BlobStore(tmp_path)
    steps: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        target = Path(os.readlink(f"/proc/self/fd/{fd}"))
        steps.append(f"fsync {target.relative_to(tmp_path)}/" if target.is_dir() else "fsync file")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        dst = Path(dst)
        steps.append("replace temporary" if dst.name.startswith(".") else f"replace {dst.relative_to(tmp_path)}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    data = b"weights" * 1000
    sha = hashlib.sha256(data).hexdigest()
    aa, bb = f"blobs/{sha[:2]}", f"blobs/{sha[:2]}/{sha[2:4]}"
    placing = ["replace temporary", "fsync file", f"replace {bb}/{sha}", f"fsync {bb}/"]
    for new_folders in (["fsync blobs/", f"fsync {aa}/"], []):  # the same bytes a second time: folders exist
        steps.clear()
        received = store.tmp / "upload.part"
        received.write_bytes(data)
        store.place(received, sha)
        assert steps == new_folders + placing
        assert store.path(sha).read_bytes() == data and not received.exists()
        assert os.listdir(store.path(sha).parent) == [sha]  # no temporary left beside it
