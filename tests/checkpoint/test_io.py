"""The durable checkpoint writer: write-behind, complete writes, torch's CRC option left alone."""

from __future__ import annotations

import io
import itertools
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from ember.checkpoint import io as ckpt_io
from ember.checkpoint.io import load_file, save_file


def _state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(300, 300, generator=g), "b": torch.randn(300, generator=g), "step": 7}


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )


def test_write_back_is_started_for_each_written_range_once_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, int]] = []
    real = ckpt_io._sync_file_range()

    def recording(fd: int, offset: int, length: int, flags: int) -> int:
        calls.append((offset, length))
        return real(fd, offset, length, flags) if real is not None else 0

    monkeypatch.setattr(ckpt_io, "_sync_file_range", lambda: recording)
    monkeypatch.setattr(ckpt_io, "_WRITE_BEHIND_BYTES", 64 << 10)
    state = _state()
    save_file(state, tmp_path / "a.ckpt")

    assert _same(load_file(tmp_path / "a.ckpt"), state)
    size = (tmp_path / "a.ckpt").stat().st_size
    assert len(calls) >= 5  # ~360 kB of tensors in 64 kB steps, the large one in slices
    assert calls[0][0] == 0
    assert all(off == prev_off + prev_len for (prev_off, prev_len), (off, _) in itertools.pairwise(calls))
    assert all(length >= (64 << 10) - 4096 for _, length in calls)
    assert all(length % 4096 == 0 for _, length in calls)  # whole pages: the last, partial one waits
    assert calls[-1][0] + calls[-1][1] <= size


def test_a_failing_write_back_request_stops_the_requests_and_the_save_still_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def unsupported(fd: int, offset: int, length: int, flags: int) -> int:
        calls.append(offset)
        return -1

    monkeypatch.setattr(ckpt_io, "_sync_file_range", lambda: unsupported)
    monkeypatch.setattr(ckpt_io, "_WRITE_BEHIND_BYTES", 64 << 10)
    state = _state()
    save_file(state, tmp_path / "a.ckpt")
    assert calls == [0]
    assert _same(load_file(tmp_path / "a.ckpt"), state)


def test_short_raw_writes_are_completed(monkeypatch: pytest.MonkeyPatch) -> None:
    class ShortWrites(io.RawIOBase):
        def __init__(self) -> None:
            self.data = bytearray()

        def writable(self) -> bool:
            return True

        def fileno(self) -> int:
            return -1

        def write(self, b: Any) -> int:
            chunk = bytes(memoryview(b)[:1000])  # at most 1,000 bytes per call, as a raw file may
            self.data += chunk
            return len(chunk)

    monkeypatch.setattr(ckpt_io, "_sync_file_range", lambda: None)
    raw = ShortWrites()
    writer = ckpt_io._WriteBehind(raw)  # type: ignore[arg-type]
    state = _state()
    torch.save(state, writer)
    assert _same(torch.load(io.BytesIO(bytes(raw.data)), weights_only=True), state)


@pytest.mark.parametrize("user_setting", [True, False])
def test_torchs_crc_option_is_left_as_it_was_after_a_save_and_after_a_failed_one(
    tmp_path: Path, user_setting: bool
) -> None:
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(user_setting)
    try:
        save_file(_state(), tmp_path / "a.ckpt", skip_zip_crc=True)
        assert torch.serialization.get_crc32_options() is user_setting
        with pytest.raises(Exception):  # noqa: B017 - whatever pickle raises for a lambda
            save_file({"f": lambda: 0}, tmp_path / "b.ckpt", skip_zip_crc=True)
        assert torch.serialization.get_crc32_options() is user_setting
        assert not (tmp_path / "b.ckpt").exists()
        assert not list(tmp_path.glob(".*tmp*"))
        # the lock was released both times: another thread can save
        done = threading.Event()
        thread = threading.Thread(
            target=lambda: (save_file(_state(), tmp_path / "c.ckpt", skip_zip_crc=True), done.set()), daemon=True
        )
        thread.start()
        thread.join(timeout=60)
        assert done.is_set()
    finally:
        torch.serialization.set_crc32_options(before)


def test_crcs_are_off_only_until_the_first_write(tmp_path: Path) -> None:
    seen: list[bool] = []
    with open(tmp_path / "x", "wb", buffering=0) as raw:
        writer = ckpt_io._WriteBehind(raw)
        with ckpt_io._zip_crc_until_first_write(writer, skip=True):
            seen.append(torch.serialization.get_crc32_options())
            writer.write(b"x")
            seen.append(torch.serialization.get_crc32_options())
    assert seen == [False, True]


def test_a_checkpoint_saved_by_default_passes_a_zip_crc_test(tmp_path: Path) -> None:
    import zipfile

    save_file(_state(), tmp_path / "a.ckpt")
    with zipfile.ZipFile(tmp_path / "a.ckpt") as z:
        assert z.testzip() is None  # every CRC-32 right: unzip -t passes


def _save_during_a_skipping_window(save: Any, path: Path) -> None:
    """Run ``save(path)`` in a thread while CRCs are off as in a skip_zip_crc save before its first write.

    The save must wait for the window to close; its file must then pass the zip CRC test.
    """
    import time
    import zipfile

    ckpt_io._CRC32_LOCK.acquire()
    torch.serialization.set_crc32_options(False)
    try:
        thread = threading.Thread(target=save, args=(path,), daemon=True)
        thread.start()
        time.sleep(0.2)
        assert thread.is_alive()  # waiting for the window to close
    finally:
        torch.serialization.set_crc32_options(True)
        ckpt_io._CRC32_LOCK.release()
    thread.join(timeout=60)
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None


def test_a_save_that_waits_for_a_skipping_one_keeps_its_crcs(tmp_path: Path) -> None:
    _save_during_a_skipping_window(lambda path: save_file(_state(), path), tmp_path / "a.ckpt")


def test_checkpoints_skip_zip_crcs_on_request_and_shared_weights_keep_them(tmp_path: Path) -> None:
    import zipfile

    import ember
    from ember import checkpoint
    from tests.models import tiny_mlp

    save_file(_state(), tmp_path / "a.ckpt", skip_zip_crc=True)
    with zipfile.ZipFile(tmp_path / "a.ckpt") as z:
        assert any(name.endswith("data.pkl") for name in z.namelist())  # a valid zip directory
        assert z.testzip() is not None  # the records carry no CRC-32 (torch.load does not check them)
    model = tiny_mlp(0)
    engine = ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1))[0]
    checkpoint.save_model(tmp_path / "weights.pt", engine)
    with zipfile.ZipFile(tmp_path / "weights.pt") as z:
        assert z.testzip() is None  # the file for sharing: every CRC right


def test_weights_for_sharing_wait_until_no_checkpoint_has_the_crcs_switched_off(tmp_path: Path) -> None:
    import ember
    from ember import checkpoint
    from tests.models import tiny_mlp

    model = tiny_mlp(0)
    engine = ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1))[0]
    _save_during_a_skipping_window(lambda path: checkpoint.save_model(path, engine), tmp_path / "w.pt")
