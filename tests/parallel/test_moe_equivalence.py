"""Expert parallelism on 4 and 2 ranks (and MoE under DDP) equals one process; fp16 master weights
under ZeRO-1 equal DDP's.

One torchrun of 4 processes (``scripts/moe_ranks.py``) runs every case; the tests read its
reports. The reference is one process holding every expert, fed each rank's shard in turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.dist import torchrun

pytestmark = pytest.mark.multiprocess
TOL = 1e-6


@pytest.fixture(scope="module")
def ranks() -> dict[int, dict[str, Any]]:
    res = torchrun(Path(__file__).parent / "scripts" / "moe_ranks.py", nproc=4, timeout=300).results
    assert sorted(res) == [0, 1, 2, 3]
    return res


@pytest.mark.parametrize(("case", "experts"), [("ep4", [["0"], ["1"], ["2"], ["3"]]),
                                               ("ep2", [["0", "1"], ["2", "3"], ["0", "1"], ["2", "3"]]),
                                               ("ddp", [["0", "1", "2", "3"]] * 4)])  # fmt: skip
def test_expert_parallel_routes_like_one_process_and_matches_it_within_1e_6(
    ranks: dict[int, dict[str, Any]], case: str, experts: list[list[str]]
) -> None:
    for rank, r in ranks.items():
        assert r[f"{case}.local_experts"] == experts[rank]  # each rank holds its experts, by global index
        assert r[f"{case}.same_routing"], rank  # the same tokens to the same experts, the same ones dropped
        assert r[f"{case}.loss_diff"] <= TOL and r[f"{case}.out_diff"] <= TOL
        assert r[f"{case}.norm_diff"] <= TOL
        assert r[f"{case}.scalars"] == ["moe/aux_loss", "moe/dropped_fraction"]
    assert ranks[0][f"{case}.param_diff"] <= TOL  # every expert and the rest, gathered on rank 0
    assert ranks[0][f"{case}.optim_diff"] <= TOL
    assert all(r[f"{case}.others_empty"] != (case == "ddp") for rank, r in ranks.items() if rank)


def test_no_token_is_dropped_with_room_and_many_at_a_tight_capacity(ranks: dict[int, dict[str, Any]]) -> None:
    assert all(r["ep4.dropped"] == 0 for r in ranks.values())
    assert all(r["ep2.dropped"] > 50 for r in ranks.values())  # and the reference dropped exactly those
    assert ranks[0]["ep4.norms"] == 4  # clipping ran at every update, over every expert once
    assert "×2 × 2 expert-data" in ranks[0]["ep2.policy"] and ranks[0]["ddp.policy"] == "ddp"


def test_expert_parallel_state_dict_resumes_bit_identical(ranks: dict[int, dict[str, Any]]) -> None:
    assert all(r["resume.identical"] for r in ranks.values())


def test_expert_parallel_with_bf16_master_weights_stays_near_fp32(ranks: dict[int, dict[str, Any]]) -> None:
    for r in ranks.values():
        assert r["ep4_bf16.loss_diff"] <= 5e-3  # 4 updates; bf16 keeps 8 bits of mantissa
    assert ranks[0]["ep4_bf16.param_diff"] <= 5e-2


def test_zero1_shards_fp16_masters_and_equals_ddp_bit_for_bit(ranks: dict[int, dict[str, Any]]) -> None:
    here = [r["master.masters_here"] for _, r in sorted(ranks.items())]
    assert all(whole == 803 for whole, _ in here) and sum(part for _, part in here) == 803
    assert max(part for _, part in here) < 803
    for r in ranks.values():
        assert r["master.policies"] == ["ddp with master_weights=True", "zero1 (sharded fp32 masters)"]
        assert r["master.param_dtype"] == "torch.float16"
        assert r["master.norm_diff"] <= TOL
        assert r["master.scale"] == {"loss_scale": {"scale": 32768.0, "clean_updates": 0, "overflows": 0}}  # capped
    assert ranks[0]["master.zero1_equals_ddp"] and ranks[0]["master.optim_diff"] == 0.0
    assert ranks[0]["master.round_trip"] and ranks[0]["master.saved_dtype"] == "torch.float32"
