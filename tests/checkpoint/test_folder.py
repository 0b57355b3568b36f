"""A checkpoint folder's housekeeping: a damaged checkpoint that resume skipped is set aside, not in
the way of the save at its step; one writing trainer per folder; errors that name the cause without
torch's advice or DCP's tracebacks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from ember import checkpoint
from ember.checkpoint import folder
from ember.checkpoint.io import save_file
from ember.checkpoint.sharded import STATE_FILE
from ember.cli import main as ember_main
from ember.errors import CheckpointError
from ember.trainer import Trainer, hooks
from tests.checkpoint.test_hostile import make_sharded
from tests.trainer.helpers import RecordingLogger, loader, make_engine

GOOD = "ckpt-e0001-s000000002.ckpt"  # one epoch of 2 batches
NEWER = "ckpt-e0002-s000000004.ckpt"


def train(directory: Path, epochs: int, resume: Any = None, logger: Any = None, extra: Any = ()) -> Trainer:
    trainer = Trainer(make_engine(), logger=logger)
    hook = hooks.CheckpointHook(directory, every_n_epochs=1, keep_last=None, save_last=False)
    trainer.fit(loader(16), epochs=epochs, hooks=[hook, *extra], resume=resume)
    return trainer


def test_resume_sets_a_damaged_sharded_checkpoint_aside_and_saves_at_its_step_again(tmp_path: Path) -> None:
    train(tmp_path, 1)
    damaged = tmp_path / NEWER  # a sharded checkpoint (saved by more processes) whose state file is damaged
    damaged.mkdir()
    (damaged / STATE_FILE).write_bytes(b"PK\x03\x04 cut short")
    logger = RecordingLogger()
    first = train(tmp_path, 2, resume="auto", logger=logger)  # falls back to GOOD, trains epoch 2, saves NEWER
    assert first.get_hook("CheckpointHook").resumed_from == tmp_path / GOOD  # type: ignore[attr-defined]
    (warning,) = logger.lines("falling back to the checkpoint before it")
    assert f"set aside as '{NEWER}.damaged', kept for inspection" in warning
    assert (tmp_path / NEWER).is_file() and (tmp_path / f"{NEWER}.damaged" / STATE_FILE).is_file()
    again = train(tmp_path, 2, resume="auto")  # the next attempt resumes from the new save: no crash loop
    assert again.get_hook("CheckpointHook").resumed_from == tmp_path / NEWER  # type: ignore[attr-defined]
    assert [f.path.name for f in checkpoint.find_checkpoints(tmp_path)] == [GOOD, NEWER]


def test_a_file_save_replaces_a_sharded_checkpoint_of_that_name(tmp_path: Path) -> None:
    target = tmp_path / NEWER
    target.mkdir()
    (target / STATE_FILE).write_text("the sharded checkpoint of 2 processes")
    save_file({"w": torch.ones(2)}, target)  # the same state saved again by one process
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.ones(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == [NEWER]  # no temporary left


class SecondTrainer(hooks.BaseHook):
    """At the first batch, starts a second trainer on the same checkpoint folder."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory, self.refused = directory, ""

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        if not self.refused:
            with pytest.raises(CheckpointError) as refused:
                train(self.directory, 1)
            self.refused = str(refused.value)


def test_a_second_trainer_on_a_checkpoint_folder_is_refused_naming_the_first(tmp_path: Path) -> None:
    second = SecondTrainer(tmp_path)
    train(tmp_path, 1, extra=[second])
    assert second.refused.startswith(
        f"checkpoint folder {str(tmp_path)!r} is being written by another trainer (CheckpointHook "
        f"'CheckpointHook', pid {os.getpid()} on host {socket.gethostname()}, since "
    )
    assert "delete and repoint each other's checkpoints" in second.refused
    assert [f.path.name for f in checkpoint.find_checkpoints(tmp_path)] == [GOOD]  # the second wrote nothing
    train(tmp_path, 2, resume="auto")  # released when the first fit ended


def test_a_checkpoint_folder_that_is_a_link_to_one_elsewhere_is_locked_and_used(tmp_path: Path) -> None:
    (tmp_path / "big-disk").mkdir()
    os.symlink(tmp_path / "big-disk", tmp_path / "ckpt")  # ckpt -> /mnt/big/ckpt
    train(tmp_path / "ckpt", 1)
    assert sorted(p.name for p in (tmp_path / "big-disk").iterdir()) == [GOOD, "last_checkpoint"]


def test_the_lock_of_a_trainer_killed_with_sigkill_is_released_by_the_system(tmp_path: Path) -> None:
    hold = "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX); "
    child = subprocess.Popen([sys.executable, "-c", hold + "print('held', flush=True); time.sleep(60)",
                              str(tmp_path)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdout is not None and child.stdout.readline() == "held\n"
    with pytest.raises(CheckpointError, match="is being written by another trainer"):
        folder.lock(tmp_path).release()
    child.send_signal(signal.SIGKILL)
    child.wait()
    folder.lock(tmp_path).release()


@pytest.mark.parametrize(
    ("payload", "reason"),
    [(os.system, "unsupported GLOBAL posix.system whose module posix is blocked"),
     (exec, "Unsupported global: GLOBAL exec was not an allowed global by default")],
)  # fmt: skip
def test_a_hostile_checkpoint_s_refusal_never_repeats_torch_s_advice_to_load_unsafely(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], payload: object, reason: str
) -> None:
    hostile = tmp_path / GOOD
    torch.save({"meta": payload}, hostile)  # a global the safe loader refuses
    with pytest.raises(CheckpointError) as refused:
        checkpoint.read(hostile)
    message = str(refused.value)
    assert reason in message  # torch's reason, without its advice around it: to load unsafely, or allowlist
    for advice in ("weights_only=False", "set to `False`", "Re-running", "safe_globals", "allowlist", "trust"):
        assert advice not in message
    assert ember_main(["checkpoint", "inspect", str(hostile)]) == 2
    err = capsys.readouterr().err
    assert reason in err and "False" not in err and "safe_globals" not in err


def test_export_of_a_corrupt_shard_is_one_line_without_dcp_s_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = make_sharded(tmp_path / NEWER, tmp_path / "marker", "none")
    shard = next(p for p in ckpt.iterdir() if p.suffix == ".distcp")
    shard.write_bytes(b"\xff" * shard.stat().st_size)  # the size the metadata says, the bytes garbage
    assert ember_main(["checkpoint", "export", str(ckpt), str(tmp_path / "model.pt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ember: error: cannot read the model of sharded checkpoint {str(ckpt)!r}: rank 0: ")
    assert "Traceback" not in err and "CheckpointException" not in err and len(err.strip().splitlines()) == 1
    assert "weights_only" not in err and "False" not in err  # torch's advice to load unsafely is left out


def test_resume_auto_with_a_hook_folder_that_is_a_file_says_so(tmp_path: Path) -> None:
    (tmp_path / "ckpt").write_text("not a folder")  # read as a checkpoint, it would be "truncated or corrupt"
    with pytest.raises(CheckpointError, match=r"CheckpointHook's directory .* which is not a folder: give the hook"):
        train(tmp_path / "ckpt", 1, resume="auto")
