"""Damaged checkpoints: every unreadable candidate of ``resume="auto"`` is skipped with a warning naming
it, an explicit path is one ``CheckpointError``, ``ember checkpoint`` exits 2 with the message."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ember
from ember import checkpoint
from ember.cli import main as ember_main
from ember.errors import CheckpointError
from ember.trainer import Trainer, hooks
from tests.trainer.helpers import RecordingLogger, loader, make_engine

GOOD = "ckpt-e0001-s000000002.ckpt"  # one epoch of 2 batches
NEWER = "ckpt-e0002-s000000004.ckpt"


def train(directory: Path, epochs: int, resume: Any = None, logger: Any = None, engine: Any = None) -> Trainer:
    trainer = Trainer(engine or make_engine(), logger=logger)
    hook = hooks.CheckpointHook(directory, every_n_epochs=1, keep_last=None, save_last=False)
    trainer.fit(loader(16), epochs=epochs, hooks=[hook], resume=resume)
    return trainer


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("good")
    train(directory, 1)
    return torch.load(directory / GOOD, weights_only=True)


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(state: dict[str, Any]) -> None:
        for key in path[:-1]:
            state = state[key]
        state[path[-1]] = value

    return change


def _drop(*path: Any) -> Callable[[dict[str, Any]], None]:
    def change(state: dict[str, Any]) -> None:
        for key in path[:-1]:
            state = state[key]
        del state[path[-1]]

    return change


# (what is wrong, how to make it from a good state, a bytes file instead, the message)
DAMAGE: dict[str, tuple[Callable[[dict[str, Any]], None] | bytes, str]] = {
    "zero bytes": (b"", r"is empty \(0 bytes"),
    "random bytes": (bytes(range(256)) * 8, "or not an ember checkpoint: torch's safe loader refuses it"),
    "version None": (_set(("version",), None), r"its 'version' is None \(NoneType\), not an int >= 1"),
    "version 'abc'": (_set(("version",), "abc"), "its 'version' is 'abc'"),
    "no meta": (_drop("meta"), r"it has no state\['meta'\]"),
    "no ranks": (_drop("ranks"), r"it has no state\['ranks'\]"),
    "meta step a str": (_set(("meta", "step"), "2"), r"its meta\['step'\] is '2' \(str\), not an int >= 0"),
    "trainer cur_step negative": (_set(("trainer", "cur_step"), -1), r"its trainer\['cur_step'\] is -1"),
    "sampler batch size 0": (_set(("sampler", "batch_size"), 0), r"sampler\['batch_size'\] is 0"),
    "history junk": (_set(("trainer", "history", "values"), {"loss": {"x": "y"}}), "trainer\\['history'\\]"),
    "rng junk": (_set(("ranks", 0, "rng", "torch"), torch.zeros(3)), r"ranks\[0\]\['rng'\] cannot be applied"),
    "world size vs ranks": (_set(("meta", "world_size"), 2), "2 per-rank entries|1 per-rank entries"),
}


def plant(directory: Path, good: dict[str, Any], damage: Callable[[dict[str, Any]], None] | bytes) -> Path:
    """Write the damaged checkpoint as the newest of ``directory``."""
    directory.mkdir(exist_ok=True)
    path = directory / NEWER
    if isinstance(damage, bytes):
        path.write_bytes(damage)
    else:
        state = copy.deepcopy(good)
        damage(state)
        torch.save(state, path)
    return path


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_resume_auto_skips_a_damaged_newest_checkpoint_and_an_explicit_path_raises(
    tmp_path: Path, good: dict[str, Any], case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    damage, message = DAMAGE[case]
    torch.save(good, tmp_path / GOOD)
    plant(tmp_path, good, damage)
    bad = plant(tmp_path / "kept", good, damage)  # a copy: the resumed fit writes NEWER again
    logger = RecordingLogger()
    trainer = train(tmp_path, 2, resume="auto", logger=logger)
    assert trainer.get_hook("CheckpointHook").resumed_from == tmp_path / GOOD  # type: ignore[attr-defined]
    warned = logger.lines("falling back to the checkpoint before it")
    assert len(warned) == 1 and NEWER in warned[0]
    with pytest.raises(CheckpointError, match=message) as caught:
        train(tmp_path / "fresh", 2, resume=bad)
    assert NEWER in str(caught.value) and "weights_only=False" not in str(caught.value)
    capsys.readouterr()
    for command in (["inspect", str(bad)], ["export", str(bad), str(tmp_path / "model.pt")]):
        assert ember_main(["checkpoint", *command]) == 2
        err = capsys.readouterr().err
        assert err.startswith("ember: error: ") and NEWER in err and "Traceback" not in err
    assert not (tmp_path / "model.pt").exists()


def test_a_directory_in_the_way_of_a_checkpoint_name_is_refused_before_training(tmp_path: Path) -> None:
    (tmp_path / GOOD).mkdir()  # where the first epoch's checkpoint would go
    trainer = Trainer(make_engine())
    with pytest.raises(CheckpointError, match=f"{GOOD}' is named like a checkpoint but is neither"):
        trainer.fit(loader(16), epochs=2, hooks=[hooks.CheckpointHook(tmp_path, every_n_epochs=1)], resume=None)
    assert trainer.cur_step == 0  # refused before the first batch


def test_a_checkpoint_of_another_model_is_refused_naming_the_checkpoint(tmp_path: Path) -> None:
    train(tmp_path, 1)
    other = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    engine, *_ = ember.initialize(other, optimizer, nn.CrossEntropyLoss())
    with pytest.raises(CheckpointError, match=f"{GOOD}' does not fit this model and optimizer: (?s:.)*size mismatch"):
        checkpoint.load(tmp_path / GOOD, Trainer(engine))


def test_a_legacy_format_file_is_inspected_like_the_loader_reads_it(
    tmp_path: Path, good: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    legacy = tmp_path / GOOD
    torch.save(good, legacy, _use_new_zipfile_serialization=False)
    assert checkpoint.read(legacy)["meta"]["step"] == 2
    assert ember_main(["checkpoint", "inspect", str(legacy)]) == 0
    assert "2 optimizer updates" in capsys.readouterr().out
