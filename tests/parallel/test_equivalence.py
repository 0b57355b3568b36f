"""ZeRO-1, FSDP2, tensor parallel, 2 × 2 FSDP×TP and pipeline × data|tensor match one process.

Two torchruns in all (2 and 4 processes); each script runs every mode in one launch and the
tests below read its reports. Each mode takes 5 optimizer steps on a global batch of 32 and is
compared with plain PyTorch in one process on the same batches: parameters as full tensors
(gathered by ``engine.state_dict()`` on rank 0), per-step losses of the global batch, the
gradient norms before clipping, and the optimizer state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.dist import torchrun

pytestmark = pytest.mark.multiprocess
SCRIPTS = Path(__file__).parent / "scripts"
TOL = 1e-5
TWO_RANK_MODES = ("zero1", "fsdp3", "fsdp2", "tp_gpt", "tp_mlp")


@pytest.fixture(scope="module")
def two() -> dict[int, dict[str, Any]]:
    res = torchrun(SCRIPTS / "two_ranks.py", nproc=2, timeout=240).results
    assert sorted(res) == [0, 1]
    return res


@pytest.mark.parametrize("mode", TWO_RANK_MODES)
def test_two_ranks_match_one_process_within_1e_5(two: dict[int, dict[str, Any]], mode: str) -> None:
    assert two[0][f"{mode}.param_diff"] <= TOL
    assert two[0][f"{mode}.optim_diff"] <= TOL
    for r in two.values():
        assert r[f"{mode}.loss_diff"] <= TOL
        assert r[f"{mode}.norm_diff"] <= TOL


@pytest.mark.parametrize("mode", ("gpt", "mlp"))
def test_fsdp_times_tensor_parallel_on_2x2_matches_one_process(four: dict[int, dict[str, Any]], mode: str) -> None:
    assert four[0][f"{mode}.param_diff"] <= TOL
    assert four[0][f"{mode}.optim_diff"] <= TOL
    for r in four.values():
        assert r[f"{mode}.loss_diff"] <= TOL
        assert r[f"{mode}.norm_diff"] <= TOL
        assert "tensor parallel ×2 + FSDP2" in r[f"{mode}.policy"]
    # GPT: the clipped steps (reference norms 0.78 and 0.97 > 0.6) and unclipped ones both matched.
    assert four[0]["gpt.norms_seen"] == 5
    assert any("Shard(dim=1)" in p for p in four[0]["gpt.placements"])  # really 2-D sharded


def test_mesh_coordinates_and_data_parallel_rank(
    two: dict[int, dict[str, Any]], four: dict[int, dict[str, Any]]
) -> None:
    assert two[1]["mesh_dims"] == ["pipeline", "data", "context", "tensor"] and two[1]["mesh_shape"] == [1, 2, 1, 1]
    assert two[1]["coords"] == {"pipeline": 0, "data": 1, "context": 0, "tensor": 0} and two[1]["dp"] == [1, 2]
    expected = {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)}  # tensor is the innermost dim
    for rank, (data, tensor) in expected.items():
        assert four[rank]["coords"] == {"pipeline": 0, "data": data, "context": 0, "tensor": tensor}
        assert four[rank]["context_module"][0] == four[rank]["coords"]
        assert four[rank]["dp"] == [data, 2]


def test_sub_dimension_groups_hold_the_ranks_the_layout_names(four: dict[int, dict[str, Any]]) -> None:
    """2-D, 2.5-D (depth 1) and expert layouts on 4 ranks: each group's members, gathered through
    the group itself, are the layout's ``group_ranks``, and a rank's place in them its coordinate."""
    names = {key.split(".")[2] for key in four[0] if key.startswith("groups.2d.")}
    assert names == {"pipeline", "data", "context", "tensor", "tensor_col", "tensor_row"}
    for rank, r in four.items():
        for key, (members, expected, coordinate) in ((k, v) for k, v in r.items() if k.startswith("groups.")):
            assert members == expected, key
            assert members[coordinate] == rank, key
    # 2-D on ranks 0..3 (q = 2): the rows are {0, 1} and {2, 3}, the columns {0, 2} and {1, 3}.
    assert four[1]["groups.2d.tensor_row"][0] == [0, 1] and four[1]["groups.2d.tensor_col"][0] == [1, 3]
    assert four[3]["groups.expert.expert"][0] == [2, 3] and four[3]["groups.expert.expert_data"][0] == [1, 3]


def test_a_new_ddp_on_four_ranks_resumes_bit_identically(four: dict[int, dict[str, Any]]) -> None:
    """``deterministic=True`` makes DDP's sums independent of its bucket layout, which a new DDP
    (a resume) lays out otherwise for its first update (ember.parallel.ddp)."""
    assert all(r["ddp_resume.bitwise"] for r in four.values())


def test_tensor_parallel_ranks_see_the_same_batches(
    two: dict[int, dict[str, Any]], four: dict[int, dict[str, Any]]
) -> None:
    for mode in ("tp_gpt", "tp_mlp"):  # tensor=2 on 2 processes: one data replica
        assert all(r[f"{mode}.same_batch_on_tp_ranks"] and r[f"{mode}.sampler"] == [1, 0] for r in two.values())
    for rank, r in four.items():  # 2 x 2: shard by the data coordinate
        assert r["gpt.sampler"] == [2, rank // 2]
        assert r["gpt.tp_peers_same_batch"] and r["gpt.dp_ranks_differ"]


def test_zero1_shards_optimizer_state_and_consolidates_it_on_rank_0(two: dict[int, dict[str, Any]]) -> None:
    assert all(r["zero1.optimizer_type"] == "ZeroRedundancyOptimizer" for r in two.values())
    assert two[0]["zero1.local_params"] + two[1]["zero1.local_params"] == 4  # each rank steps its share
    assert two[0]["zero1.one_process_load_diff"] <= TOL  # a plain AdamW (two groups) loads rank 0's state
    assert two[1]["zero1.other_rank_state"][1] == []  # other ranks: {} for the optimizer
    assert all(r["zero1.scheduler_follows"] for r in two.values())
    assert all(r["zero1.ranks_params_equal"] <= TOL for r in two.values())


@pytest.mark.parametrize("mode", ("fsdp3", "fsdp2", "tp_gpt"))
def test_sharded_state_dict_is_full_on_rank_0_and_empty_elsewhere(two: dict[int, dict[str, Any]], mode: str) -> None:
    assert two[0][f"{mode}.one_process_load_diff"] <= TOL  # index-keyed, like Optimizer.state_dict()
    assert two[1][f"{mode}.other_rank_state"] == [[], []]
    assert two[0][f"{mode}.optimizer_type"] == "SGD"  # the user's class, rebuilt over DTensors


@pytest.mark.parametrize("mode", ("zero1", "fsdp3"))
@pytest.mark.parametrize("how", ("broadcast", "all_ranks"))
def test_engine_loads_a_full_state_from_rank_0_or_every_rank(
    two: dict[int, dict[str, Any]], mode: str, how: str
) -> None:
    assert two[0][f"{mode}.load_{how}.param_diff"] == 0.0
    assert two[0][f"{mode}.load_{how}.optim_diff"] == 0.0
    assert all(r[f"{mode}.load_{how}.num_updates"] == 5 for r in two.values())


def test_fsdp_bf16_mixed_precision_trains_close_to_fp32(two: dict[int, dict[str, Any]]) -> None:
    assert two[0]["bf16.loss_diff"] < 5e-2 and two[0]["bf16.param_diff"] < 5e-3
    assert two[0]["bf16.dtypes"] == ["torch.float32"]  # sharded parameters stay fp32


def test_pipeline_2_times_data_2_trainer_matches_one_process(four: dict[int, dict[str, Any]]) -> None:
    """Per-Engine layout pipeline 2 × data 2 (ranks 0, 1: stage 0; 2, 3: stage 1), 1F1B, clip 0.6."""
    assert four[0]["pp_dp.param_diff"] <= TOL and four[0]["pp_dp.optim_diff"] <= TOL
    for r in four.values():
        assert r["pp_dp.steps"] == 5 and r["pp_dp.loss_diff"] <= TOL and r["pp_dp.norm_diff"] <= TOL
        assert r["pp_dp.test_loss_diff"] <= TOL and r["pp_dp.load_diff"] == 0.0
    assert four[0]["pp_dp.labels"] == four[2]["pp_dp.labels"]  # the stages of one replica: same batches
    assert four[1]["pp_dp.labels"] == four[3]["pp_dp.labels"]
    assert four[0]["pp_dp.labels"] != four[1]["pp_dp.labels"]  # the replicas: different shards


def test_pipeline_2_times_tensor_2_trainer_matches_one_process(four: dict[int, dict[str, Any]]) -> None:
    """Pipeline 2 × tensor 2 (ranks 0, 1: stage 0 = embed, blocks.0; 2, 3: stage 1 = blocks.1,
    pool, head), each stage's block split by ``plans.gpt_block``; 1F1B, clip 0.6."""
    assert four[0]["pp_tp.param_diff"] <= TOL and four[0]["pp_tp.optim_diff"] <= TOL
    assert four[0]["pp_tp.norms_over_clip"] > 0  # the reference clipped: the global norm mattered
    for rank, r in four.items():
        assert r["pp_tp.steps"] == 5 and r["pp_tp.loss_diff"] <= TOL and r["pp_tp.norm_diff"] <= TOL
        assert r["pp_tp.test_loss_diff"] <= TOL and r["pp_tp.load_diff"] == 0.0
        assert r["pp_tp.stage_layers"] == (["embed", "blocks.0"] if rank < 2 else ["blocks.1", "pool", "head"])
        assert "(Shard(dim=0),)" in r["pp_tp.placements"] and "(Shard(dim=1),)" in r["pp_tp.placements"]
        assert "× tensor 2 (6 modules split)" in r["pp_tp.policy"] and r["pp_tp.optimizer_type"] == "SGD"
    assert all(r["pp_tp.other_rank_state"] == [[], []] for rank, r in four.items() if rank)
    assert four[0]["pp_tp.labels"] == four[1]["pp_tp.labels"] == four[2]["pp_tp.labels"]  # one replica


def test_pipeline_times_tensor_checkpoint_hook_resumes_from_a_single_file(four: dict[int, dict[str, Any]]) -> None:
    """CheckpointHook saved every 2 updates (rank 0's full state, one file); a fresh Engine with other
    initial weights resumed from update 4, ran only update 5, and ended where one process did."""
    assert "ckpt-e0000-s000000004.ckpt" in four[0]["pp_tp.checkpoints"]
    assert four[0]["pp_tp.resume_param_diff"] <= TOL and four[0]["pp_tp.resume_optim_diff"] <= TOL
    assert all(r["pp_tp.resumed_steps"] == 5 and r["pp_tp.resumed_batches"] == 1 for r in four.values())


def test_pipeline_2_times_data_2_with_zero_1_matches_one_process(four: dict[int, dict[str, Any]]) -> None:
    """Pipeline 2 × data 2 (GPipe, clip 0.6), each stage's optimizer a ZeroRedundancyOptimizer over
    its 2 replicas; rank 0 gets the consolidated state of both stages."""
    assert four[0]["pp_zero1.param_diff"] <= TOL and four[0]["pp_zero1.optim_diff"] <= TOL
    for r in four.values():
        assert r["pp_zero1.steps"] == 5 and r["pp_zero1.loss_diff"] <= TOL and r["pp_zero1.norm_diff"] <= TOL
        assert r["pp_zero1.test_loss_diff"] <= TOL and r["pp_zero1.load_diff"] == 0.0
        assert r["pp_zero1.optimizer_type"] == "ZeroRedundancyOptimizer" and "+ ZeRO-1" in r["pp_zero1.policy"]
    assert four[0]["pp_zero1.labels"] != four[1]["pp_zero1.labels"]  # the replicas: different shards


@pytest.mark.parametrize("how", ["engine", "hook"])
@pytest.mark.parametrize("mode", ["zero1", "zero3"])
def test_a_scheduler_built_before_initialize_drives_the_rebuilt_optimizer(
    two: dict[int, dict[str, Any]], mode: str, how: str
) -> None:
    # CosineAnnealingLR over the user's AdamW (two groups), not passed to initialize, stepped
    # after each of 10 updates by hand or by LRSchedulerHook: the same LRs and weights as DDP.
    for r in two.values():
        assert r[f"early.{mode}.{how}.steps"] == 10 and r[f"early.{mode}.{how}.lr_changed"]
        assert r[f"early.{mode}.{how}.lr_diff"] == 0.0
        assert r[f"early.{mode}.{how}.user_view"]
    assert two[0][f"early.{mode}.{how}.param_diff"] <= 1e-6  # the sharded optimizers stepped with those LRs
