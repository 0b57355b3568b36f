"""The examples run end to end and reach what they promise (each exits non-zero otherwise)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ember import track
from ember.track.store import list_runs
from tests.dist import torchrun

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(script: str, cwd: Path, *args: str, timeout: float = 240) -> str:
    env = {**os.environ, "EMBER_HOME": str(cwd / ".ember"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
    )
    assert proc.returncode == 0, f"{script} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def _accuracies(output: str) -> list[float]:
    return [float(a) / 100 for a in re.findall(r"test acc (\d+\.\d+)%", output)]


def test_demo_trains_digits_to_95_percent_and_records_the_run(tmp_path: Path) -> None:
    out = _run("demo.py", tmp_path)
    assert _accuracies(out)[-1] >= 0.95
    assert "epoch 1/" in out  # the per-epoch log lines
    (run,) = list_runs(tmp_path / ".ember")
    assert run.status == "Complete"


def test_engine_loop_example_reaches_95_percent(tmp_path: Path) -> None:
    assert _accuracies(_run("engine_loop.py", tmp_path))[-1] >= 0.95


@pytest.mark.parametrize("script", ["transfer_learning.py", "progressive_resizing.py"])
def test_trainer_examples_succeed(script: str, tmp_path: Path) -> None:
    _run(script, tmp_path)


@pytest.mark.multiprocess
def test_ddp_tracking_example_leaves_exactly_one_run(tmp_path: Path) -> None:
    home = tmp_path / ".ember"
    torchrun(EXAMPLES / "ddp_tracking.py", nproc=2, args=["--epochs", "3", "--out", str(tmp_path / "m.pt")],
             env={"EMBER_HOME": str(home)})  # fmt: skip
    (info,) = list_runs(home)
    run = track.load_run(info.path, home=home)
    assert run.status == "Complete" and run.hparams["world_size"] == 2
    assert [p["epoch"] for p in run.metrics("val")] == [0, 1, 2]
    (edge,) = [e for e in run.lineage() if e["source"]["kind"] == "run"]
    assert edge["target"]["name"] == "digits-model"
