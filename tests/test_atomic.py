"""ember._atomic, the one atomic write: the old file or the new one, fsynced, and every writer uses it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from ember import _atomic
from ember._atomic import atomic_open, atomic_path, atomic_write


def _steps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the fsyncs (of a file or a folder) and renames, in order."""
    steps: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        steps.append("fsync folder" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync file")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        steps.append(f"replace {Path(dst).name}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return steps


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="tells a folder's fd from a file's through /proc")
def test_a_write_fsyncs_the_file_renames_it_then_fsyncs_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = _steps(monkeypatch)
    atomic_write(tmp_path / "a.json", "{}")
    assert steps == ["fsync file", "replace a.json", "fsync folder"]
    assert (tmp_path / "a.json").read_text() == "{}" and os.listdir(tmp_path) == ["a.json"]


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="half way"), atomic_open(target, "w") as f:
        f.write("new, half")
        raise RuntimeError("half way")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["a.txt"]
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".a.txt.tmp-")
        assert list(tmp_path.glob(_atomic.TEMPORARY_GLOB)) == []  # nothing written yet
        tmp.write_text("new")
        assert list(tmp_path.glob(_atomic.TEMPORARY_GLOB)) == [tmp]
    assert target.read_text() == "new"


def test_atomic_open_refuses_a_mode_that_does_not_write_a_new_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mode must start with 'w' or 'x'"), atomic_open(tmp_path / "a", "a"):
        pass


def _run_json(home: Path) -> None:
    from ember import track

    track.create_run(name="r", home=home).finish()


def _pointer(home: Path) -> None:
    from ember.checkpoint.io import write_pointer

    write_pointer(home, "ckpt-e0001-s000000001.ckpt")


def _artifact_copy(home: Path) -> None:
    from ember import track

    (home / "data.bin").write_bytes(b"x" * 10)
    track.create_artifact("data", home=home).add_file(home / "data.bin")


def _checkpoint(home: Path) -> None:
    from ember.checkpoint.io import save_file

    save_file({"w": 1}, home / "a.ckpt")


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="tells a folder's fd from a file's through /proc")
@pytest.mark.parametrize("write", [_run_json, _pointer, _artifact_copy, _checkpoint], ids=lambda f: f.__name__[1:])
def test_the_store_and_the_checkpoints_write_through_the_one_helper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write: Callable[[Path], None]
) -> None:
    steps = _steps(monkeypatch)
    write(tmp_path)
    renames = [i for i, step in enumerate(steps) if step.startswith("replace")]
    assert renames
    for i in renames:  # the file fsynced before its rename, the folder after it
        assert steps[i - 1] == "fsync file" and steps[i + 1] == "fsync folder", steps
