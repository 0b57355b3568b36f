"""Two gloo processes under torchrun match one process on the same global batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dist import torchrun

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def ranks() -> dict[int, dict]:
    res = torchrun(Path(__file__).parent / "scripts" / "ddp_equivalence.py", nproc=2).results
    assert sorted(res) == [0, 1]
    return res


def test_two_processes_match_one_process_with_and_without_accumulation(ranks: dict[int, dict]) -> None:
    for r in ranks.values():
        assert r["world_size"] == 2
        assert r["max_diff_accum1"] <= 1e-6
        assert r["max_diff_accum2"] <= 1e-6
        assert r["ranks_identical_accum1"] and r["ranks_identical_accum2"]
        assert r["any_true"] is True


def test_accumulation_all_reduces_gradients_only_on_boundary_micro_steps(ranks: dict[int, dict]) -> None:
    for r in ranks.values():
        every = r["accum1"]["allreduces_per_backward"]
        assert len(every) == 6 and all(n >= 1 for n in every)
        accum2 = r["accum2"]["allreduces_per_backward"]
        assert len(accum2) == 12
        assert accum2[0::2] == [0] * 6, "a non-boundary micro-step all-reduced: no_sync is not in effect"
        assert accum2[1::2] == every, "each boundary micro-step all-reduces exactly as a step without accumulation"


def test_find_unused_parameters_from_the_config_reaches_the_ddp_module(ranks: dict[int, dict]) -> None:
    for r in ranks.values():
        assert r["accum1"]["find_unused_parameters"] is False
        assert r["find_unused"] == {"alias": True, "ddp_section": True}


def test_compile_wraps_the_compiled_module_in_ddp_and_trains_like_one_process(ranks: dict[int, dict]) -> None:
    for r in ranks.values():
        run = r["compile"]
        assert run["ddp_wraps_compiled"], "DDP must wrap torch.compile's module (compile before DDP)"
        assert run["model_is_bare"] and run["state_keys"] == r["bare_keys"]
        assert r["compiled_graphs"] >= 1, "the forward never went through torch.compile"
        assert r["max_diff_compile"] <= 1e-6 and r["ranks_identical_compile"]
        assert not r["accum1"]["ddp_wraps_compiled"]  # without compile, DDP wraps the bare model


def test_parameters_unfrozen_after_initialize_train_like_one_process_and_stay_equal_on_every_rank(
    ranks: dict[int, dict],
) -> None:
    for r in ranks.values():
        for name in ("unfreeze", "unfreeze_accum2", "unfreeze_zero1"):
            assert r[f"max_diff_{name}"] <= 1e-6, (name, r[f"max_diff_{name}"])
            assert r[f"ranks_identical_{name}"], name
            assert r[name]["rebuilt"], f"{name}: the DDP wrapper was not rebuilt for the unfrozen parameters"
        assert not r["accum1"]["rebuilt"]  # nothing unfrozen: the DDP wrapper stays
        # the comm hook registered on the first wrapper is carried over: the late backwards all-reduce too
        assert all(n >= 1 for n in r["unfreeze"]["allreduces_per_backward"])
    assert ranks[0]["max_diff_unfreeze_fsdp"] <= 1e-6  # FSDP2 follows requires_grad by itself


def test_a_parameter_frozen_after_initialize_raises_before_the_update_on_every_rank(ranks: dict[int, dict]) -> None:
    for r in ranks.values():
        frozen = r["frozen_after"]
        assert frozen["error"] is not None, "DDP silently applied an update it could not average"
        assert "'0.weight'" in frozen["error"] and "find_unused_parameters=True" in frozen["error"]
        assert frozen["unchanged"]


def test_a_static_graph_with_accumulation_is_one_config_error_on_every_rank(ranks: dict[int, dict]) -> None:
    """Before: torch's ``expect_autograd_hooks_ INTERNAL ASSERT`` at the first step."""
    for r in ranks.values():
        assert r["static_graph"] is not None and "gradient_accumulation=2" in r["static_graph"]
        assert "drop ddp.static_graph" in r["static_graph"]
