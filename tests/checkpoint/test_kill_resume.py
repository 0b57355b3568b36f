"""SIGKILL a training process at chosen points, resume with ``resume="auto"``: bit-identical to no kill.

CPU, ``deterministic=True``, accumulation 2, a shuffled sampler, dropout, a step LR schedule,
checkpoints every 2 updates and at each epoch's end (see ``tests/checkpoint/common.py``).
``scripts/kill_one.py`` runs every scenario once (forked children, torch imported once).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from ember.checkpoint.folder import HOLDER_FILE
from tests.checkpoint.common import read_result
from tests.dist import ROOT

SCRIPT = Path(__file__).parent / "scripts" / "kill_one.py"
LAST_BATCH = 27  # 3 epochs x 9 batches

# scenario -> the batch the resumed run continues after (None: not fixed, see the test)
RESUMED_AFTER = {
    "mid-epoch-mid-cycle": 11,  # killed at batch 12 (half a cycle): the update-6 checkpoint
    "after-an-update-before-its-save": 11,  # killed at batch 15 after update 8, before it was saved
    "before-any-checkpoint": 0,  # nothing saved yet: "auto" starts fresh
    "writing-a-checkpoint": 15,  # killed before renaming epoch 1's final checkpoint: update 8's
    "before-the-pointer-update": 22,  # the newest complete file wins over a stale pointer
    "async-save-mid-cycle": None,  # 18, or 15 when the background write had not finished
}


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("kill")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out)], capture_output=True, text=True, timeout=240, cwd=ROOT, env=env
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("scenario", list(RESUMED_AFTER))
def test_a_run_killed_and_resumed_with_auto_ends_bit_identical(
    killed: tuple[Path, dict[str, Any]], scenario: str
) -> None:
    out, summary = killed
    assert summary["ref"] == {"exit": 0}
    assert summary[scenario]["first"] == {"signal": 9}, "the first run was not killed"
    assert summary[scenario]["second"] == {"exit": 0}
    ref_params, ref = read_result(out / "ref")
    params, got = read_result(out / scenario)
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params, strict=True))
    after = got["resumed_at"]
    expected = RESUMED_AFTER[scenario]
    if expected is None:
        assert after in (15, 18)
    else:
        assert after == expected
    assert sorted(got["losses"]) == list(range(after + 1, LAST_BATCH + 1))
    assert got["losses"] == {b: ref["losses"][b] for b in got["losses"]}
    assert got["history"] == ref["history"]  # epoch averages too: the metric sums were resumed
    assert got["counters"] == ref["counters"]


def test_a_kill_during_a_write_leaves_only_a_temporary_and_the_previous_checkpoints(
    killed: tuple[Path, dict[str, Any]],
) -> None:
    found = killed[1]["writing-a-checkpoint"]
    temporaries = [n for n in found["listing"] if n.startswith(".") and n != HOLDER_FILE]  # .lock: the folder's lock
    assert len(temporaries) == 1 and temporaries[0].startswith(".ckpt-e0002-s000000010.ckpt.tmp-")
    assert "ckpt-e0002-s000000010.ckpt" not in found["listing"]
    assert found["pointer"] == "ckpt-e0001-s000000008.ckpt"
    resumed_dir = killed[0] / "writing-a-checkpoint" / "ckpt"
    stale = [p for p in resumed_dir.iterdir() if p.name.startswith(".") and p.name != HOLDER_FILE]
    assert not stale, "the stale temporary was not removed"


def test_a_second_signal_exits_at_once_without_saving(killed: tuple[Path, dict[str, Any]]) -> None:
    found = killed[1]["second-signal"]
    assert found["first"] == {"exit": 128 + 15}
    # the first SIGTERM (batch 12) would have saved at update 7 (batch 13): the second came first
    assert "ckpt-e0001-s000000006.ckpt" in found["listing"] and "ckpt-e0001-s000000007.ckpt" not in found["listing"]
