"""Two gloo processes under torchrun match one process on the same global batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dist import torchrun

pytestmark = pytest.mark.multiprocess


def test_two_processes_match_one_process_with_and_without_accumulation() -> None:
    res = torchrun(Path(__file__).parent / "scripts" / "ddp_equivalence.py", nproc=2).results
    assert sorted(res) == [0, 1]
    for r in res.values():
        assert r["world_size"] == 2
        assert r["max_diff_accum1"] <= 1e-6
        assert r["max_diff_accum2"] <= 1e-6
        assert r["ranks_identical_accum1"] and r["ranks_identical_accum2"]
        assert r["any_true"] is True
