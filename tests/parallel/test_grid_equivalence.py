"""2-D, 2.5-D, 3-D (and Colossal-AI's 1-D layers) train like one process, on 4 and 8 gloo processes.

Two torchruns serve every check: the 4-process one of ``test_equivalence.py`` (``four``, whose
script calls ``scripts/grid_four.py``) and an 8-process one launched with seed 001's Colossal-AI
config (``scripts/grid_eight.py``). Each mode trains the tiny ViT of ``tests/parallel/vit.py`` for
4 updates of a global batch of 8 (SGD with momentum, clipping at 0.5, a StepLR); the ranks report
their losses and norms, rank 0 its whole final state, and this process compares them with the
same model of torch's modules trained here: losses and parameters within 1e-6, gradient norms
within 1e-6 relative. The one-process resume of the 3-D checkpoint runs here too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.dist import torchrun
from tests.parallel import grid_jobs
from tests.parallel.common import dataset, max_diff, optimizer_state_diff, reference, sgd, tiny_gpt
from tests.parallel.conftest import SCRIPTS
from tests.parallel.scripts.grid_eight import MODES
from tests.parallel.scripts.grid_four import CONVERT

pytestmark = pytest.mark.multiprocess
TOL = 1e-6
FOUR = {"2d4": "2d tensor parallel ×4 (col 2 × row 2)",
        "2.5d4": "2.5d tensor parallel ×4 (dep 1 × col 2 × row 2)",
        "1d": "1d tensor parallel ×2 (tensor 2) × data 2"}  # fmt: skip
EIGHT = {"2d": "2d tensor parallel ×4 (col 2 × row 2) × data 2",
         "2.5d": "2.5d tensor parallel ×8 (dep 2 × col 2 × row 2)",
         "3d": "3d tensor parallel ×8 (output 2 × input 2 × weight 2)"}  # fmt: skip
Results = dict[int, dict[str, Any]]


@pytest.fixture(scope="module")
def eight(tmp_path_factory: pytest.TempPathFactory) -> tuple[Results, Path]:
    out = tmp_path_factory.mktemp("grid8")
    res = torchrun(SCRIPTS / "grid_eight.py", nproc=8, args=[str(out)], timeout=420).results
    assert sorted(res) == list(range(8))
    return res, out


def _matches(results: Results, out: Path, mode: str, ref: dict[str, Any], policy: str) -> None:
    state = torch.load(out / f"{mode}.pt")
    assert max_diff(state["model"], ref["model"]) <= TOL
    assert optimizer_state_diff(state["optimizer"], ref["optimizer"]) <= TOL
    for r in results.values():
        assert r[f"{mode}.policy"] == policy
        assert max(abs(a - b) for a, b in zip(r[f"{mode}.losses"], ref["losses"], strict=True)) <= TOL
        assert max(abs(a - b) / b for a, b in zip(r[f"{mode}.norms"], ref["norms"], strict=True)) <= TOL


@pytest.mark.parametrize("mode", sorted(FOUR))
def test_on_4_ranks_each_mode_trains_like_one_process(four: Results, four_out: Path, mode: str) -> None:
    _matches(four, four_out, mode, grid_jobs.reference(), FOUR[mode])


@pytest.mark.parametrize("mode", sorted(EIGHT))
def test_on_8_ranks_each_mode_trains_like_one_process(eight: tuple[Results, Path], mode: str) -> None:
    """2-D with 2 data replicas and gradient accumulation 2, 2.5-D of depth 2, 3-D; every update of
    the reference was clipped, so the norm over the shards (each block once) decided each one."""
    results, out = eight
    ref = grid_jobs.reference(accumulation=MODES[mode][1].get("gradient_accumulation", 1))
    assert all(norm > 0.5 for norm in ref["norms"])
    _matches(results, out, mode, ref, EIGHT[mode])


def test_a_plain_models_linear_and_layernorm_layers_are_placed_on_the_2d_grid(four: Results, four_out: Path) -> None:
    """plan=None under mode '2d': TinyGPT's 17 nn.Linear / nn.LayerNorm layers become 2-D layers; the
    input is split over the grid and the output gathered whole for the plain loss."""
    c = CONVERT
    ref = reference(tiny_gpt(), sgd, dataset(c["samples"], tokens=4), c["batch"], c["steps"], clip=c["clip"])
    assert four[0]["convert.layers"] == ["LayerNorm2D", "Linear2D"]
    assert max_diff(torch.load(four_out / "convert.pt")["model"], ref["model"]) <= TOL
    for r in four.values():
        assert "17 layers converted" in r["convert.policy"]
        assert max(abs(a - b) for a, b in zip(r["convert.losses"], ref["losses"], strict=True)) <= TOL


def test_the_seed_config_runs_pipeline_2_times_2d_tensor_4_with_fp16(eight: tuple[Results, Path]) -> None:
    """Seed 001's ``fp16=dict(mode=AMP_TYPE.TORCH)``, ``parallel=dict(pipeline=2, tensor=dict(size=4,
    mode='2d'))``: PipelinableContext, colossalai.initialize, Trainer(engine, logger). fp16 tracks
    fp32 PyTorch; an inf in one stage-1 rank's gradient made all 8 ranks skip the last update and
    halve the one scale they share; ``AccuracyHook(accuracy_func=colossalai.nn.metric.Accuracy())``
    counts the 2-D logits' rows right."""
    results, _ = eight
    ref = grid_jobs.reference(clip=None, schedule=False)
    for rank, r in results.items():
        assert r["seed.schedule"] == "PipelineSchedule" and r["seed.criterion"] == "CrossEntropyLoss2D"
        assert f"stage {rank // 4}" in r["seed.policy"] and r["seed.policy"].endswith("× 2d tensor 4")
        assert max(abs(a - b) for a, b in zip(r["seed.losses"][:3], ref["losses"][:3], strict=True)) < 5e-3
        assert r["seed.skipped"] == [False, False, False, True] and r["seed.updates"] == 4
        assert r["seed.scales"] == results[0]["seed.scales"] and r["seed.scales"][-1] == r["seed.scales"][0] / 2
        assert r["seed.gpc"] == [rank % 2, rank % 4 // 2, 2, False]  # PARALLEL_2D_ROW/COL as Colossal-AI numbers them
        # colossalai.nn.metric.Accuracy is Accuracy2D: the epoch's train accuracy over all 32 samples
        assert r["seed.metric"] == "Accuracy2D"
        assert abs(r["seed.accuracy"][0] - sum(ref["correct"][:4]) / 32) <= 1 / 32


def test_pipeline_2_times_2d_tensor_4_in_fp32_matches_one_process(eight: tuple[Results, Path]) -> None:
    """The same split model, fp32, clipping and a StepLR, through an Engine loop: the stages'
    whole state on rank 0."""
    from ember.parallel.layers import layers_for
    from ember.parallel.pipeline import sequential_layers
    from tests.parallel.vit import ViT

    results, out = eight
    ref = grid_jobs.reference()
    layer_of = {f"_module_list.{i}": name for i, (name, _) in enumerate(sequential_layers(ViT(layers_for(None))))}
    state = torch.load(out / "pipe2d.pt")["model"]
    renamed = {layer_of[".".join(k.split(".")[:2])] + "." + k.split(".", 2)[2]: v for k, v in state.items()}
    assert max_diff(renamed, ref["model"]) <= TOL
    for r in results.values():
        assert max(abs(a - b) for a, b in zip(r["pipe2d.losses"], ref["losses"], strict=True)) <= TOL


def test_sharded_checkpoints_resume_bit_identically_and_load_into_another_layout(
    four: Results, eight: tuple[Results, Path]
) -> None:
    """2-D, 2.5-D and 3-D runs saved sharded checkpoints at update 2: resumed on the same layout they
    end bit-identical; the 2-D checkpoint resumed on 1-D layers with 2 data replicas within 1e-6."""
    results, _ = eight
    for mode in ("3d", "2.5d"):
        assert "ckpt-e0000-s000000002.ckpt" in results[0][f"ckpt{mode}.saved"]
        assert results[0][f"ckpt{mode}.bit_identical"]
        assert all(r[f"ckpt{mode}.resumed_steps"] == [3, 4] and r[f"ckpt{mode}.loss_same"] for r in results.values())
    assert four[0]["ckpt2d.same.param_diff"] == 0.0 and four[0]["ckpt2d.to1d.param_diff"] <= TOL
    for r in four.values():
        assert r["ckpt2d.same.steps"] == r["ckpt2d.to1d.steps"] == [3, 4]
        assert r["ckpt2d.same.loss_diff"] == 0.0 and r["ckpt2d.to1d.loss_diff"] <= TOL
        assert r["ckpt2d.to1d.policy"] == FOUR["1d"]


def test_a_3d_checkpoint_resumes_in_one_process_and_exports_plain_weights(
    eight: tuple[Results, Path], tmp_path: Path
) -> None:
    """The 8-rank 3-D checkpoint of update 2, resumed by the one-process ViT of torch's modules,
    ends within 1e-6 of the 3-D run; ``ember checkpoint export`` of its last checkpoint writes the
    3-D run's final weights under the plain model's keys."""
    from ember.cli import main
    from ember.trainer import hooks

    _, out = eight
    final = torch.load(out / "3d-final.pt")
    again = hooks.CheckpointHook(tmp_path / "one", every_n_steps=None, every_n_epochs=None, save_last=False)
    weights, losses, policy = grid_jobs.fit(None, again, resume=out / "3d" / "ckpt-e0000-s000000002.ckpt")
    assert sorted(losses) == [3, 4] and policy == "none"
    assert weights is not None and max_diff(weights, final) <= TOL
    exported = tmp_path / "plain.pt"
    last = sorted(p for p in (out / "3d").iterdir() if p.name.endswith(".ckpt"))[-1]
    assert main(["checkpoint", "export", str(last), str(exported)]) in (0, None)
    plain = torch.load(exported)
    assert sorted(plain) == sorted(final) and all(torch.equal(plain[k], final[k]) for k in final)
