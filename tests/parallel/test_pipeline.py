"""Pipeline parallel 2 (GPipe and 1F1B) through the Trainer matches one process.

One torchrun (2 processes) runs both schedules; each takes 5 optimizer steps of
``Trainer.fit`` on a global batch of 32 and is compared with plain PyTorch in one process:
parameters as full tensors (gathered by ``engine.state_dict()`` on rank 0), per-step losses as
every rank's hooks see them, gradient norms, optimizer state, and an evaluation pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.dist import torchrun

pytestmark = pytest.mark.multiprocess
SCRIPTS = Path(__file__).parent / "scripts"
TOL = 1e-5
SCHEDULES = ("gpipe", "1f1b")


@pytest.fixture(scope="module")
def pipe() -> dict[int, dict[str, Any]]:
    res = torchrun(SCRIPTS / "pipeline_ranks.py", nproc=2, timeout=240).results
    assert sorted(res) == [0, 1]
    return res


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_pipeline_2_trainer_matches_one_process_within_1e_5(pipe: dict[int, dict[str, Any]], schedule: str) -> None:
    assert pipe[0][f"{schedule}.param_diff"] <= TOL
    assert pipe[0][f"{schedule}.optim_diff"] <= TOL
    for r in pipe.values():
        assert r[f"{schedule}.steps"] == 5
        assert r[f"{schedule}.loss_diff"] <= TOL  # the last stage's loss, broadcast to every rank
        assert r[f"{schedule}.norm_diff"] <= TOL


def test_clipping_spans_both_stages(pipe: dict[int, dict[str, Any]]) -> None:
    assert pipe[0]["1f1b.norms_over_clip"] > 0  # the reference clipped: the global norm really mattered
    assert pipe[1]["1f1b.norm_diff"] <= TOL


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_evaluation_runs_forward_only_through_the_pipeline(pipe: dict[int, dict[str, Any]], schedule: str) -> None:
    for r in pipe.values():  # 20 samples in batches of 8: the last batch of 4 too
        assert r[f"{schedule}.test_loss_diff"] <= TOL
        assert r[f"{schedule}.test_accuracy_diff"] <= TOL


def test_split_points_and_even_split_place_the_layers(pipe: dict[int, dict[str, Any]]) -> None:
    assert pipe[0]["gpipe.stage_layers"] == ["embed", "blocks.0", "blocks.1"]  # split_points=["blocks.2"]
    assert pipe[1]["gpipe.stage_layers"] == ["blocks.2", "blocks.3", "pool", "head"]
    assert pipe[0]["1f1b.stage_layers"] == ["embed", "blocks.0", "blocks.1", "blocks.2"]  # 7 layers: 4 + 3
    assert pipe[1]["1f1b.stage_layers"] == ["blocks.3", "pool", "head"]


def test_every_pipeline_rank_sees_the_same_batches_and_outputs(pipe: dict[int, dict[str, Any]]) -> None:
    assert pipe[0]["coords"] == {"pipeline": 0, "data": 0, "context": 0, "tensor": 0}
    assert pipe[1]["coords"] == {"pipeline": 1, "data": 0, "context": 0, "tensor": 0}
    assert pipe[0]["dp"] == pipe[1]["dp"] == [0, 1]  # one data replica: both stages load the same shard
    for schedule in SCHEDULES:
        assert pipe[0][f"{schedule}.labels"] == pipe[1][f"{schedule}.labels"]
        assert pipe[0][f"{schedule}.outputs"] == pipe[1][f"{schedule}.outputs"]  # the output is broadcast too


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_state_dict_is_full_on_rank_0_and_loads_back_into_the_stages(
    pipe: dict[int, dict[str, Any]], schedule: str
) -> None:
    assert pipe[1][f"{schedule}.other_rank_state"] == [[], []]
    for r in pipe.values():
        assert r[f"{schedule}.load_diff"] == 0.0
        assert "pipeline ×2" in r[f"{schedule}.policy"]
        assert "Trainer(engine, schedule=engine.schedule)" in r[f"{schedule}.direct_forward_error"]
