"""Hostile sharded checkpoints: a directory named like a checkpoint runs no code from its files.

Each one carries a pickle that, unpickled by plain ``pickle``, would write a marker file: in
DCP's ``.metadata``, or as a "bytes" entry of the shard files (which DCP itself loads with
``torch.load(weights_only=False)``). Every way ember opens a checkpoint must refuse it with a
``CheckpointError`` (exit 2 on the command line) and leave no marker.
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ember import checkpoint
from ember.checkpoint.safe_dcp import read_metadata
from ember.checkpoint.sharded import DCP_FORMAT, STATE_FILE
from ember.checkpoint.snapshot import capture
from ember.cli import main as ember_main
from ember.errors import CheckpointError
from ember.trainer import Trainer, hooks
from tests.trainer.helpers import RecordingLogger, loader, make_engine

NAME = "ckpt-e0001-s000000004.ckpt"


class Payload:
    """Unpickled by plain pickle, it writes ``marker``: the proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def make_sharded(directory: Path, marker: Path, where: str) -> Path:
    """A sharded checkpoint of the tiny MLP whose ``where`` ("metadata", "bytes" or "none") carries the payload.

    "bytes": the optimizer's learning rate (read on resume) and an extra model entry (read by an
    export) are the payload.
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict

    directory.mkdir(parents=True)
    trainer = Trainer(make_engine())
    trainer.fit(loader(16), epochs=1)
    engine = trainer.engine
    model, optimizer = get_state_dict(engine.model, engine.optimizer)
    if where == "bytes":
        model["evil"] = Payload(marker)
        optimizer["param_groups"][0]["lr"] = Payload(marker)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's "assuming the intent is to save in a single process"
        dcp.save({"model": model, "optimizer": optimizer}, checkpoint_id=directory, no_dist=True)
    if where == "metadata":
        (directory / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    state = capture(trainer, shards={"format": DCP_FORMAT, "world_size": 1, "layout": "none"})
    torch.save(state, directory / STATE_FILE)
    assert not marker.exists()
    return directory


def _fit(tmp_path: Path, resume: Any, logger: Any = None) -> None:
    trainer = Trainer(make_engine(), logger=logger)
    hook = hooks.CheckpointHook(tmp_path / "ckpt", every_n_epochs=None, save_last=False)
    trainer.fit(loader(16), epochs=1, hooks=[hook], resume=resume)


OPENERS: dict[str, Callable[[Path, Path], Any]] = {
    "read": lambda ckpt, tmp: checkpoint.read(ckpt),
    "model_state": lambda ckpt, tmp: checkpoint.model_state(ckpt),
    "load": lambda ckpt, tmp: checkpoint.load(ckpt, Trainer(make_engine())),
    "fit(resume=path)": lambda ckpt, tmp: _fit(tmp, ckpt),
    "inspect": lambda ckpt, tmp: ember_main(["checkpoint", "inspect", str(ckpt)]),
    "export": lambda ckpt, tmp: ember_main(["checkpoint", "export", str(ckpt), str(tmp / "model.pt")]),
}


@pytest.mark.parametrize("where", ["metadata", "bytes"])
@pytest.mark.parametrize("opener", sorted(OPENERS))
def test_a_hostile_sharded_checkpoint_is_refused_without_running_its_code(
    tmp_path: Path, where: str, opener: str
) -> None:
    marker = tmp_path / "marker"
    ckpt = make_sharded(tmp_path / "in" / NAME, marker, where)
    if where == "bytes" and opener in ("read", "inspect"):
        OPENERS[opener](ckpt, tmp_path)  # they read no bytes entry: only the (safe) metadata
    elif opener in ("inspect", "export"):
        assert OPENERS[opener](ckpt, tmp_path) == 2  # the message printed, no traceback
    else:
        with pytest.raises(CheckpointError, match=r"not part of torch\.distributed\.checkpoint|safe loader refuses"):
            OPENERS[opener](ckpt, tmp_path)
    assert not marker.exists()
    assert not (tmp_path / "model.pt").exists()


def test_resume_auto_skips_a_hostile_checkpoint_planted_in_the_folder_with_a_warning(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    make_sharded(tmp_path / "ckpt" / NAME, marker, "metadata")
    logger = RecordingLogger()
    _fit(tmp_path, "auto", logger)  # nothing readable: starts fresh
    assert not marker.exists()
    assert logger.lines(f"{NAME}' has no readable torch.distributed.checkpoint metadata")


def test_real_dcp_metadata_reads_with_the_restricted_unpickler(tmp_path: Path) -> None:
    # the classes, sizes, dtypes, layouts and paths DCP writes (an optimizer's param groups as bytes)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    from torch.distributed.checkpoint.state_dict import get_state_dict

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(dict(zip(("model", "optimizer"), get_state_dict(model, opt), strict=True)), checkpoint_id=tmp_path,
                 no_dist=True)  # fmt: skip
    metadata = read_metadata(tmp_path)
    assert {"model.weight", "optimizer.param_groups.0.betas"} <= set(metadata.state_dict_metadata)


def test_metadata_that_places_data_outside_the_directory_is_refused(tmp_path: Path) -> None:
    ckpt = make_sharded(tmp_path / NAME, tmp_path / "marker", "none")
    metadata = read_metadata(ckpt)
    info = next(iter(metadata.storage_data.values()))
    info.relative_path = "../../etc/passwd"
    (ckpt / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(CheckpointError, match="not a shard file of the directory"):
        checkpoint.read(ckpt)
