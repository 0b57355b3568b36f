"""Hostile files where tracking reads: run folders that are links, pipes or devices are listed as
Damaged without being opened; YAML bombs, pipes and devices as config or image files are refused;
``add_dir`` refuses a pipe inside; a write the file-size limit stops is one clear error; bad
``conflict_strategy`` and ``platform.json`` are never silent."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import struct
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from ember import track
from ember.compat.t9k import em
from ember.errors import TrackingError
from ember.track.images import MAX_SIDE
from tests.track.test_damaged_runs import ember


def _run(name: str) -> Path:
    run = track.create_run(name=name)
    run.finish()
    assert run.path is not None
    return run.path


class WaitingWriter(threading.Thread):
    """Opens ``fifo`` for writing, which blocks until something opens it for reading."""

    def __init__(self, fifo: Path) -> None:
        super().__init__(daemon=True)
        self.fifo, self.opened = fifo, False

    def run(self) -> None:
        with open(self.fifo, "wb"):
            self.opened = True

    def release(self) -> None:
        if not self.opened:  # open the reading end ourselves, so the thread ends
            os.close(os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK))
            self.join(5)


def test_runs_ls_lists_hostile_run_folders_as_damaged_and_opens_none(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _run("good")
    fifo_run, zero_run = _run("fifo"), _run("zero")
    (fifo_run / "run.json").unlink()
    os.mkfifo(fifo_run / "run.json")
    (zero_run / "run.json").unlink()
    os.symlink("/dev/zero", zero_run / "run.json")
    outside = tmp_path / "outside"  # a folder out of the store that holds a readable run.json
    outside.mkdir()
    (outside / "run.json").write_text((good / "run.json").read_text())
    os.symlink(outside, store / "runs" / "linked_261127_000000_aaaaaa")
    os.mkfifo(store / "runs" / "pipe_261127_000000_bbbbbb")  # not even a folder
    writer = WaitingWriter(fifo_run / "run.json")
    writer.start()
    try:
        assert ember("runs", "ls") == 0
        assert not writer.opened  # nobody opened the pipe
    finally:
        writer.release()
    out, err = capsys.readouterr()
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "Complete" in rows[good.name]
    assert "run.json is a named pipe (FIFO)" in rows[fifo_run.name] and "Damaged" in rows[fifo_run.name]
    assert "run.json is a symbolic link" in rows[zero_run.name]
    assert "the run folder is a symbolic link" in rows["linked_261127_000000_aaaaaa"]
    assert "is a named pipe (FIFO), not a run folder" in rows["pipe_261127_000000_bbbbbb"]
    assert "4 damaged run(s)" in err
    assert ember("runs", "show", fifo_run.name) == 1  # found by name, and says why
    assert "is a named pipe (FIFO): the store expects a regular file there" in capsys.readouterr().out


BOMB = "name: bomb\nhparams:\n  a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"  {b}: &{b} [{', '.join(['*' + a] * 10)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)  # 10**9 values once expanded, 10 lines as written


@pytest.mark.parametrize("create", [track.create_run, em.create_run], ids=["track", "t9k-em"])
def test_a_config_path_is_read_with_ember_s_one_safe_yaml_loader(tmp_path: Path, create: object, store: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    cases = {bomb: "more than once through shared parts", fifo: "not a regular file",
             Path("/dev/zero"): "not a regular file"}  # fmt: skip
    for path, message in cases.items():
        with pytest.raises(TrackingError, match=message):
            create(config_path=path)  # type: ignore[operator]
    assert not (store / "runs").exists() or not list((store / "runs").iterdir())  # nothing created
    good = tmp_path / "good.yaml"
    good.write_text("name: from-yaml\nhparams:\n  lr: 1e-3\n")
    run = create(config_path=good)  # type: ignore[operator]
    assert run.name == "from-yaml" and run.hparams["lr"] == 0.001  # 1e-3 a float, as in ember's configs
    run.finish()


def _png_header_only(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def test_log_image_reads_only_regular_files_of_a_bounded_size(tmp_path: Path) -> None:
    huge = tmp_path / "huge.png"
    huge.write_bytes(_png_header_only(60000, 60000))
    fifo = tmp_path / "fifo.png"
    os.mkfifo(fifo)
    cases = {
        "/dev/zero": "is a character device, not a regular file",
        str(fifo): r"is a named pipe \(FIFO\), not a regular file",
        str(tmp_path / "missing.png"): "does not exist",
        str(tmp_path): "is a folder, not a regular file",
        str(huge): f"a PNG of 60000x60000 pixels \\(its header\\); a side may be 1 to {MAX_SIDE}",
    }
    run = track.create_run(name="images")
    for step, (image, message) in enumerate(cases.items()):
        with pytest.raises(TrackingError, match=message):
            run.log_image("x", image, step=step)
    assert run.images() == []
    with open(run.path / "images.jsonl", "w") as f:  # type: ignore[operator]
        f.write("[" * 100_000 + "]" * 100_000 + "\n")  # a complete line, not a record
    with pytest.raises(TrackingError, match=r"images.jsonl: line 1 is not JSON \(RecursionError\)"):
        run.images()
    run.finish()


FLOATS = sorted({d for d in vars(torch).values() if isinstance(d, torch.dtype) and d.is_floating_point}, key=str)


@pytest.mark.parametrize("dtype", [d for d in FLOATS if d != torch.float4_e2m1fn_x2], ids=str)  # 4-bit pairs
def test_log_image_takes_a_tensor_of_every_float_dtype_torch_has(dtype: torch.dtype) -> None:
    pixels = torch.tensor([[0.0, 0.5], [1.0, 0.25]])
    run = track.create_run(name="dtypes")
    run.log_image("x", pixels.to(dtype), step=0)
    (line,) = run.images()
    assert (line["width"], line["height"]) == (2, 2)
    run.finish()


def test_add_dir_refuses_a_pipe_inside_naming_it_and_copies_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("a")
    os.mkfifo(folder / "sub" / "pipe")
    artifact = track.create_artifact(name="data")
    with pytest.raises(TrackingError, match=r"sub/pipe is a named pipe \(FIFO\), not a regular file; nothing was"):
        artifact.add_dir(folder)
    assert artifact.files == []
    (folder / "sub" / "pipe").unlink()
    assert [f["path"] for f in artifact.add_dir(folder)] == ["data/a.txt"]


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """``ulimit -f``, for this process: a write past ``limit`` bytes fails with EFBIG (Python ignores SIGXFSZ)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_writes_stopped_by_the_file_size_limit_are_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = track.create_run(name="limited")
    for step in range(2000):
        run.log("train", {"loss": 1.0 / (step + 1), "accuracy": step / 2000}, step=step)
    run.finish()
    noise = np.random.default_rng(0).integers(0, 255, (128, 128, 3), dtype=np.uint8)  # ~49 kB as PNG
    again = track.load_run(run.path, resume=True)  # type: ignore[arg-type]
    with file_size_limit(16 << 10):
        with pytest.raises(TrackingError, match=r"cannot write image 'noise' .*: File too large \(the file-size"):
            again.log_image("noise", noise, step=0)
        code = ember("runs", "export", run.name, "--format", "csv", "--output", str(tmp_path / "out.csv"))
    again.finish()
    assert code == 2
    assert f"cannot write {tmp_path / 'out.csv'}: File too large (the file-size limit" in capsys.readouterr().err
    assert not (tmp_path / "out.csv").exists()


def test_a_bad_conflict_strategy_is_refused_without_auto_upload_too(store: Path) -> None:
    for create in (track.create_run, em.create_run):
        with pytest.raises(TrackingError, match=r"conflict_strategy 'bogus': use one of new, skip, error, replace"):
            create(conflict_strategy="bogus")
    assert not (store / "runs").exists() or not list((store / "runs").iterdir())


def test_a_platform_json_that_is_not_an_object_is_damage_everywhere_it_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _run("platform")
    (path / "platform.json").write_text("[]")
    assert ember("runs", "show", path.name) == 1
    assert "platform.json holds [] (list), not an object" in capsys.readouterr().out
    assert ember("runs", "export", path.name, "--format", "json", "--output", str(tmp_path / "x.json")) == 2
    assert "platform.json holds [] (list), not an object" in capsys.readouterr().err


@pytest.mark.parametrize("which", ["root", "runs"])
def test_a_store_that_is_a_file_is_one_clear_error_in_the_api_and_the_cli(
    tmp_path: Path, which: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "store"
    if which == "root":
        home.write_text("not a folder")
    else:
        home.mkdir()
        (home / "runs").write_text("not a folder")
    message = rf"tracking store's {'root' if which == 'root' else 'runs folder'} .* is not a folder"
    with pytest.raises(TrackingError, match=message):
        track.create_run(name="x", home=home)
    monkeypatch.setenv("EMBER_HOME", str(home))
    with pytest.raises(TrackingError, match=message + r" \(from \$EMBER_HOME\)"):
        em.create_run(name="x")
    assert ember("runs", "ls", "--store", str(home)) == 2  # the CLI's one error line, exit code 2
    assert re.search(message, capsys.readouterr().err)
    assert home.is_file() or (home / "runs").is_file()  # nothing replaced
