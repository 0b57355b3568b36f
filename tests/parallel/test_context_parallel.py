"""Context (sequence) parallelism and activation checkpointing on 4 gloo processes.

One torchrun (``scripts/context_ranks.py``), launched with Colossal-AI's
``parallel=dict(tensor=dict(size=2, mode="sequence"))``: ember's context parallelism over 2
ranks (contiguous slices) × 2 data replicas. Per-Engine layouts add context 4 and context 2 ×
tensor 2. Tolerance 1e-6 (fp32) against one process; activation checkpointing bitwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.dist import torchrun

pytestmark = pytest.mark.multiprocess
TOL = 1e-6
RINGS = [
    f"ring.{n}.{split}.{mask}" for n in (2, 4) for split in ("zigzag", "contiguous") for mask in ("causal", "full")
]
LAYOUTS = {
    "cp4": "context parallel ×4 (zig-zag)",
    "cp2_dp2_full": "context parallel ×2 (zig-zag)",
    "cp2_tp2": "tensor parallel ×2 + context parallel ×2 (contiguous)",
}


@pytest.fixture(scope="module")
def ranks() -> dict[int, dict[str, Any]]:
    res = torchrun(Path(__file__).parent / "scripts" / "context_ranks.py", nproc=4, timeout=300).results
    assert sorted(res) == [0, 1, 2, 3]
    return res


@pytest.mark.parametrize("case", RINGS)
def test_ring_attention_equals_one_process_sdpa_forward_and_every_gradient(
    ranks: dict[int, dict[str, Any]], case: str
) -> None:
    """Output, dq, dk, dv of ring attention on 2 and 4 ranks, causal and not, zig-zag and
    contiguous, against SDPA on the whole sequence: within 1e-6, nothing divided by the ring size."""
    for r in ranks.values():
        assert max(r[case]) <= TOL, r[case]


def test_sdpa_calls_as_models_make_them_take_the_ring(ranks: dict[int, dict[str, Any]]) -> None:
    """Grouped-query heads (enable_gqa) and 3-D inputs within 1e-6; under bf16 autocast the ring
    computes in bf16 as SDPA would (within bf16's rounding); ``torch.arange`` over the local
    length from 0 in a context-parallel forward is warned about on rank 0."""
    for r in ranks.values():
        assert r["routed.gqa"] <= TOL and r["routed.3d"] <= TOL
        assert r["routed.bf16"][0] == "torch.bfloat16" and r["routed.bf16"][1] <= 3e-2
    assert ranks[0]["routed.arange_warning"]


def test_gathering_the_sequence_sums_each_slices_gradient_over_the_ranks(ranks: dict[int, dict[str, Any]]) -> None:
    assert all(r["gather.2"] == 0.0 and r["gather.4"] == 0.0 for r in ranks.values())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_context_parallel_engine_matches_one_process(ranks: dict[int, dict[str, Any]], layout: str) -> None:
    """4 updates of a 2-block causal LM (cp2_dp2_full: bidirectional, accumulation 2; cp4: clip 0.5):
    parameters, optimizer state, the global-batch loss and the pre-clip norm of every update."""
    assert ranks[0][f"{layout}.param_diff"] <= TOL and ranks[0][f"{layout}.optim_diff"] <= TOL
    for r in ranks.values():
        assert r[f"{layout}.loss_diff"] <= TOL and r[f"{layout}.norm_diff"] <= TOL
        assert r[f"{layout}.policy"] == LAYOUTS[layout]
    assert ranks[0]["cp4.norms"] == 4  # clipping saw the global norm every update
    assert ranks[0]["cp4.local_shape"] == [8, 4]  # each rank got a quarter of every 16-token sequence


def test_trainer_on_the_launched_colossalai_sequence_layout_matches_one_process_and_resumes_exactly(
    ranks: dict[int, dict[str, Any]],
) -> None:
    assert ranks[0]["launched"] == "ParallelLayout(pipeline=1, data=2, tensor=1, context=2)"
    assert ranks[0]["trainer.param_diff"] <= TOL
    for r in ranks.values():
        assert r["trainer.steps"] == 4 and r["trainer.eval_diff"] <= TOL
        assert r["trainer.policy"] == "context parallel ×2 (contiguous)"
    assert all(r["trainer.other_rank_state"] for rank, r in ranks.items() if rank)  # full state on rank 0
    assert ranks[0]["trainer.resumed_bitwise"]  # from update 2's checkpoint: the same weights at update 4


def test_activation_checkpointing_is_bitwise_under_pipeline_parallelism(ranks: dict[int, dict[str, Any]]) -> None:
    """Pipeline 2 × data 2 through the Trainer (GPipe, 2 micro-batches), 3 updates."""
    assert ranks[0]["ckpt.pipeline.bitwise"]
    for r in ranks.values():
        assert r["ckpt.pipeline.checkpointed"] == [f"blocks.{i}" for i in range(4)]
        assert r["ckpt.pipeline.policy"].startswith("pipeline ×2") and r["ckpt.pipeline.policy"].endswith("× data 2")


@pytest.mark.parametrize("layout", ["ddp", "fsdp_tp", "cp"])
def test_activation_checkpointing_is_bitwise_under_every_parallel_mode(
    ranks: dict[int, dict[str, Any]], layout: str
) -> None:
    """3 updates with dropout 0.1, with and without checkpointing every block: identical weights."""
    assert ranks[0][f"ckpt.{layout}.bitwise"] and ranks[0][f"ckpt.{layout}.moved"]
    expected = {"ddp": "ddp", "fsdp_tp": "tensor parallel ×2 + FSDP2 zero stage 3 ×2", "cp": "context parallel ×2"}
    assert ranks[0][f"ckpt.{layout}.policy"].startswith(expected[layout])


@pytest.mark.parametrize(
    ("case", "message"),
    [
        (
            "no_sdpa",
            "EngineError: HandAttention's forward pass made no torch.nn.functional.scaled_dot_product_attention",
        ),
        ("mask", "EngineError: scaled_dot_product_attention got an attn_mask of shape (4, 4)"),
        ("dropout", "EngineError: scaled_dot_product_attention got dropout_p=0.1"),
        ("mha", "EngineError: nn.MultiheadAttention under context parallelism"),
        ("length", "DataError: batch[0] (shape (4, 12), sequence dim 1) has sequence length 12"),
    ],
)
def test_bad_input_is_one_ember_error_on_every_rank(ranks: dict[int, dict[str, Any]], case: str, message: str) -> None:
    assert all(r[f"bad.{case}"].startswith(message) for r in ranks.values()), ranks[0][f"bad.{case}"]


def test_colossalai_ring_self_attention_has_exact_gradients(ranks: dict[int, dict[str, Any]]) -> None:
    """TransformerSelfAttentionRing (layer scaling, a padding mask) and RingQK/RingAV on the
    launched 2-rank sequence group against Colossal-AI's arithmetic on the whole sequence."""
    for r in ranks.values():
        for key in ("output_diff", "input_grad_diff", "param_grad_diff", "ring_q_grad_diff", "ring_k_grad_diff"):
            assert r[f"colossal.{key}"] <= TOL, (key, r[f"colossal.{key}"])
        assert r["colossal.bias_is_dense_bias"] and r["gpc.initialised"]
    assert [ranks[k]["gpc.sequence"] for k in range(4)] == [[0, 2], [1, 2], [0, 2], [1, 2]]
    assert [ranks[k]["gpc.sequence_dp"] for k in range(4)] == [[0, 4], [1, 4], [2, 4], [3, 4]]
    assert [ranks[k]["gpc.data"] for k in range(4)] == [[0, 2], [0, 2], [1, 2], [1, 2]]
