"""The zip-CRC opt-in at every entry point: ``checkpoint.save``, sharded saves and ``CheckpointHook``.

By default a checkpoint's zip records carry their CRC-32s (``zipfile``'s ``testzip()``, as
``unzip -t``, finds nothing wrong); with ``skip_zip_crc=True`` they do not (``testzip()`` names a
member) and the file still loads.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ember
from ember import checkpoint
from ember.checkpoint.sharded import STATE_FILE, is_sharded
from ember.parallel.policy import ShardedPolicy
from ember.trainer import Trainer, hooks
from tests.models import tiny_mlp

# dcp.save in one process without a process group says it assumes one process
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _trainer(sharded: bool = False) -> tuple[Trainer, list[tuple[torch.Tensor, torch.Tensor]]]:
    model = tiny_mlp(0)
    engine = ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss())[0]
    if sharded:  # one process: a layout whose checkpoints are DCP directories, over whole tensors
        engine.parallel = ShardedPolicy(None, "tensor parallel (one process)")
        assert is_sharded(engine)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 8, generator=g), torch.randint(0, 2, (4,), generator=g)) for _ in range(4)]
    return Trainer(engine), batches


def _crcs_kept(path: Path) -> bool:
    with zipfile.ZipFile(path) as z:
        return z.testzip() is None


def _loads(path: Path) -> None:
    state = checkpoint.read(path)
    assert "engine" in state and "meta" in state


def test_checkpoint_save_keeps_crcs_unless_asked(tmp_path: Path) -> None:
    trainer, batches = _trainer()
    trainer.fit(batches, epochs=1, hooks=[])
    kept = checkpoint.save(tmp_path / "kept.ckpt", trainer)
    skipped = checkpoint.save(tmp_path / "skipped.ckpt", trainer, skip_zip_crc=True)
    assert kept is not None and skipped is not None
    assert _crcs_kept(kept)
    assert not _crcs_kept(skipped)
    _loads(skipped)
    fresh, _ = _trainer()
    checkpoint.load(skipped, fresh)
    for a, b in zip(fresh.engine.model.parameters(), trainer.engine.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_sharded_save_keeps_its_state_files_crcs_unless_asked(tmp_path: Path) -> None:
    trainer, batches = _trainer(sharded=True)
    trainer.fit(batches, epochs=1, hooks=[])
    kept = checkpoint.save(tmp_path / "ckpt-e0001-s000000004.ckpt", trainer)
    skipped = checkpoint.save(tmp_path / "ckpt-e0001-s000000005.ckpt", trainer, skip_zip_crc=True)
    assert kept is not None and skipped is not None and kept.is_dir() and skipped.is_dir()
    assert _crcs_kept(kept / STATE_FILE)
    assert not _crcs_kept(skipped / STATE_FILE)
    _loads(skipped)


@pytest.mark.parametrize("async_save", [False, True])
@pytest.mark.parametrize("skip", [False, True])
def test_checkpoint_hook_keeps_crcs_unless_asked(tmp_path: Path, async_save: bool, skip: bool) -> None:
    trainer, batches = _trainer()
    kwargs: dict[str, Any] = {"skip_zip_crc": True} if skip else {}
    hook = hooks.CheckpointHook(tmp_path, every_n_steps=2, every_n_epochs=None, keep_last=None,
                                save_last=False, async_save=async_save, **kwargs)  # fmt: skip
    trainer.fit(batches, epochs=1, hooks=[hook])
    files = sorted(tmp_path.glob("*.ckpt"))
    assert [f.name for f in files] == ["ckpt-e0000-s000000002.ckpt", "ckpt-e0000-s000000004.ckpt"]
    for f in files:
        assert _crcs_kept(f) is not skip
        _loads(f)


def test_a_sharded_checkpoint_hook_keeps_crcs_unless_asked(tmp_path: Path) -> None:
    for skip in (False, True):
        trainer, batches = _trainer(sharded=True)
        directory = tmp_path / str(skip)
        hook = hooks.CheckpointHook(directory, every_n_epochs=1, keep_last=None, skip_zip_crc=skip)
        trainer.fit(batches, epochs=1, hooks=[hook])
        saved = directory / "ckpt-e0001-s000000004.ckpt"
        assert saved.is_dir() and _crcs_kept(saved / STATE_FILE) is not skip
        _loads(saved)
