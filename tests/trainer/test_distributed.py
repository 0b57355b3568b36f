"""Two gloo processes: placeholders, evaluation counting, and stop/error agreement across ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dist import torchrun

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def ranks() -> dict[int, dict]:
    return torchrun(Path(__file__).parent / "scripts" / "trainer_dist.py", nproc=2, timeout=150).results


def test_placeholders_resolve_to_this_ranks_share_under_two_processes(ranks: dict[int, dict]) -> None:
    for r in (0, 1):
        got = ranks[r]["placeholders"]
        assert got["values"] == {
            "NUM_EPOCHS": 2, "NUM_UPDATE_STEPS_PER_EPOCH": 3, "TOTAL_UPDATE_STEPS": 6, "TRAIN_DATALOADER_LEN": 10,
        }  # fmt: skip
        assert got["scheduler_steps"] == got["cur_step"] == 6


@pytest.mark.parametrize("n", [10, 11])
def test_evaluation_counts_each_sample_once_and_matches_one_process(ranks: dict[int, dict], n: int) -> None:
    for r in (0, 1):
        got = ranks[r][f"eval{n}"]
        assert got["counted"] == n
        assert got["acc_diff"] < 1e-7  # the same correct count; float32 vs float64 division
        assert got["loss_diff"] < 1e-6


@pytest.mark.parametrize("scenario", ["iter_error", "epoch_error"])
def test_a_hook_raising_on_one_rank_stops_both_ranks_without_hanging(ranks: dict[int, dict], scenario: str) -> None:
    failing = 1 if scenario == "iter_error" else 0
    mine, other = ranks[failing][scenario], ranks[1 - failing][scenario]
    assert mine["raised"] == "ValueError"
    assert other["raised"] == "TrainerError" and f"on rank {failing}" in other["message"]
    assert "Fails.after_train" in other["message"]
    assert mine["after_train"] == other["after_train"] == ["after_train"]
    assert mine["cur_step"] == other["cur_step"] and mine["micro_step"] == other["micro_step"]


@pytest.mark.parametrize("how", ["hook_stop", "nan_stop"])
def test_a_stop_on_one_rank_stops_every_rank_after_the_same_update(ranks: dict[int, dict], how: str) -> None:
    r0, r1 = ranks[0][how], ranks[1][how]
    # Rank 0 asks in update 2; agreeing after every update (stop_check_every_s=0), the ranks
    # learn of it without stalling, so all stop after update 3.
    assert r0["cur_step"] == r1["cur_step"] == 3 and r0["cur_epoch"] == r1["cur_epoch"] == 1
    if how == "hook_stop":
        assert r0["reason"] == "asked on rank 0 in update 2"
        assert r1["reason"] == "rank 0: asked on rank 0 in update 2"
    else:  # update 2 applied the NaN gradient everywhere: rank 1 sees its own NaN in update 3
        assert r0["reason"] == "non-finite loss (nan) at step 2, epoch 1"
        assert "non-finite loss" in r1["reason"]


def test_spaced_stop_checks_stop_every_rank_at_the_same_update_within_the_epoch(ranks: dict[int, dict]) -> None:
    # 32 updates an epoch of a few ms each, agreements ~1 s apart: the stop asked in update 2
    # lands some updates later (at the latest at the epoch's end), on the same update everywhere.
    # (At 0.05 s apart, a loaded machine's first updates took that long each, so the ranks agreed
    # after every update and "fewer exchanges than updates" failed once.)
    r0, r1 = ranks[0]["hook_stop_spaced"], ranks[1]["hook_stop_spaced"]
    assert r0["cur_step"] == r1["cur_step"] and r0["cur_epoch"] == r1["cur_epoch"] == 1
    assert 3 <= r0["cur_step"] <= 32 and r1["reason"] == "rank 0: asked on rank 0 in update 2"
    assert r0["exchanges"] == r1["exchanges"] < r0["cur_step"] - 1  # fewer exchanges than updates


def test_a_test_loader_left_whole_by_choice_is_kept_and_each_rank_evaluates_all_of_it(ranks: dict[int, dict]) -> None:
    for r in (0, 1):
        got = ranks[r]["unsharded"]
        assert got["kept_by_initialize"]  # get_dataloader(add_sampler=False) is not re-sharded
        assert got["chosen"]["counted_here"] == 11 and got["chosen"]["counted"] == 22
        assert got["chosen"]["diff"] < 1e-6  # the mean over ranks is the mean over the set
        assert got["plain"]["diff"] < 1e-6


def test_a_plain_unsharded_test_loader_is_evaluated_with_one_warning_and_a_foreign_split_is_refused(
    ranks: dict[int, dict],
) -> None:
    warned = ranks[0]["unsharded"]["warnings"]
    assert len(warned) == 1 and "not split across the 2 ranks: each rank evaluates all of it" in warned[0]
    assert ranks[1]["unsharded"]["warnings"] == []  # rank 0 speaks for the job
    for r in (0, 1):
        assert "splits the data across 4 ranks" in ranks[r]["unsharded"]["split_error"]


def test_train_loss_and_torchmetrics_accuracy_over_two_ranks_equal_one_process(ranks: dict[int, dict]) -> None:
    for r in (0, 1):
        got = ranks[r]["train_averages"]
        ref = got["one_process"]
        # float32 losses of batches of 4 (two ranks) vs of 8 (one process), summed in float64
        assert abs(got["two_ranks"]["train/loss"] - ref["train/loss"]) < 1e-6
        assert abs(got["two_ranks"]["train/acc"] - ref["train/acc"]) < 1e-7  # the same 48 predictions; float32


def test_a_mid_epoch_resume_from_per_rank_hook_states_gives_the_same_epoch_values(ranks: dict[int, dict]) -> None:
    for r in (0, 1):
        got = ranks[r]["train_averages"]
        assert got["saved_metric_updates"] == 4 and got["resumed_micro_step"] == 6
        assert got["resumed"] == got["two_ranks"]  # the same batches, states and summation order: exact


def test_only_rank_0_draws_a_progress_bar(ranks: dict[int, dict]) -> None:
    bar0, bar1 = ranks[0]["train_averages"]["stderr"], ranks[1]["train_averages"]["stderr"]
    assert "epoch 1/1" in bar0 and "6/6" in bar0 and "samples/s=" in bar0
    assert bar1 == ""  # rank 1 writes nothing at all to stderr
