"""ember's pytorch-accelerated compat against the real pytorch-accelerated (0.1.61, from PyPI).

The same program (tests/peers/scripts/pta_same_run.py), its import rewritten, trains to the
same losses (1e-6) and the same parameters (1e-6) with an unshuffled loader. Shuffled loaders
do not draw the same order: pytorch-accelerated's ``RandomSampler`` draws each epoch's order from
the process's global torch generator (so the order depends on everything drawn before it), ember's
resumable sampler from ``(seed, epoch)``, which is what lets a run resume mid-epoch exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.peers.scripts.pta_same_run import run

SCRIPT = Path(__file__).parent / "scripts" / "pta_same_run.py"


def _real(*args: str) -> dict:
    done = subprocess.run([sys.executable, str(SCRIPT), "pytorch_accelerated", *args], capture_output=True,
                          text=True, timeout=240, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_same_program_trains_to_the_same_losses_and_weights_as_pytorch_accelerated() -> None:
    real, ours = _real(), run("ember.compat.pytorch_accelerated")
    for key in ("train_loss_epoch", "eval_loss_epoch"):
        assert ours[key] == pytest.approx(real[key], abs=1e-6), key
    for a, b in zip(ours["params"], real["params"], strict=True):
        assert a == pytest.approx(b, abs=1e-6)
    assert ours["lr"] == pytest.approx(real["lr"], abs=1e-12)  # the cosine schedule ended where pta's did
