"""Disk faults during a save: one CheckpointError naming the folder and the cause, at the first save;
the earlier checkpoints stay readable and no temporary is left."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ember import checkpoint
from ember.checkpoint import io as ckpt_io
from ember.errors import CheckpointError
from ember.trainer import Trainer, hooks
from tests.trainer.helpers import loader, make_engine

ROOT = Path(__file__).resolve().parents[2]
FIRST = "ckpt-e0001-s000000002.ckpt"


def fit(directory: Path, epochs: int, resume: str | None = None) -> Trainer:
    trainer = Trainer(make_engine())
    hook = hooks.CheckpointHook(directory, every_n_epochs=1, keep_last=1, save_last=False)
    trainer.fit(loader(16), epochs=epochs, hooks=[hook], resume=resume)
    return trainer


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (errno.ENOSPC, r"No space left on device \(the disk is full"),
        (errno.EFBIG, r"File too large \(the file-size limit"),
        (errno.EROFS, r"Read-only file system \(the folder is on a read-only file system"),
    ],
)
def test_a_disk_fault_during_a_save_is_one_error_naming_the_folder_and_the_earlier_checkpoints_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, reason: str
) -> None:
    fit(tmp_path, 1)  # an earlier run's checkpoint
    earlier = checkpoint.read(tmp_path / FIRST)
    writes = 0
    real_write = ckpt_io._WriteBehind.write

    def failing_write(self: ckpt_io._WriteBehind, data: bytes | memoryview) -> int:
        nonlocal writes
        writes += 1
        if writes > 2:  # some bytes are out: torch's writer then reports "unexpected pos"
            raise OSError(code, os.strerror(code))
        return real_write(self, data)

    monkeypatch.setattr(ckpt_io._WriteBehind, "write", failing_write)
    trainer = Trainer(make_engine())
    hook = hooks.CheckpointHook(tmp_path, every_n_epochs=1, keep_last=1, save_last=False)
    with pytest.raises(CheckpointError, match=f"in folder {str(tmp_path)!r}: {reason}") as caught:
        trainer.fit(loader(16), epochs=3, hooks=[hook], resume="auto")
    assert "unexpected pos" not in str(caught.value)
    assert trainer.cur_step == 4  # the first save of this fit, after its first epoch
    assert sorted(p.name for p in tmp_path.iterdir()) == [FIRST, "last_checkpoint"]  # no temporary left
    assert checkpoint.read(tmp_path / FIRST)["meta"] == earlier["meta"]


def test_a_real_file_size_limit_names_the_cause_not_torchs_unexpected_pos(tmp_path: Path) -> None:
    fit(tmp_path, 1)
    target = tmp_path / "ckpt-e0002-s000000004.ckpt"
    script = textwrap.dedent(f"""
        import resource, signal, torch
        from ember.checkpoint.io import save_file
        from ember.errors import CheckpointError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG rather than the signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
        try:
            save_file({{"weights": torch.ones(8192)}}, {str(target)!r})
        except CheckpointError as exc:
            print("ERROR", exc)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert f"ERROR cannot write checkpoint '{target}' in folder '{tmp_path}': File too large" in out.stdout, out.stderr
    assert "(the file-size limit of this process (ulimit -f)" in out.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [FIRST, "last_checkpoint"]
    assert checkpoint.read(tmp_path / FIRST)["meta"]["step"] == 2
