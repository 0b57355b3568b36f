"""Scheduler placeholders: arithmetic, resolution inside partials, the run numbers."""

from __future__ import annotations

import functools

import pytest

from ember.errors import TrainerError
from ember.trainer import Placeholders as P
from ember.trainer.placeholders import contains_placeholders, placeholder_values, resolve, resolve_partial

VALUES = {P.NUM_EPOCHS: 3, P.NUM_UPDATE_STEPS_PER_EPOCH: 7, P.TOTAL_UPDATE_STEPS: 21}


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (P.TOTAL_UPDATE_STEPS, 21),
        (P.NUM_EPOCHS * 2 + 1, 7),
        (2 * P.NUM_UPDATE_STEPS_PER_EPOCH, 14),
        (10 + P.NUM_EPOCHS, 13),
        (P.TOTAL_UPDATE_STEPS - P.NUM_UPDATE_STEPS_PER_EPOCH, 14),
        (P.TOTAL_UPDATE_STEPS // 2, 10),
        (P.NUM_EPOCHS * 0.5 + 0.5, 2),
        ([P.NUM_EPOCHS, P.NUM_EPOCHS * 2], [3, 6]),
    ],
)
def test_placeholders_combine_with_plus_and_times_and_resolve(expr: object, expected: object) -> None:
    assert resolve(expr, VALUES) == expected
    assert isinstance(resolve(expr, VALUES), type(expected))


def test_placeholders_inside_a_partial_are_resolved() -> None:
    def make(optimizer: str, total: int, milestones: list[int]) -> tuple[str, int, list[int]]:
        return optimizer, total, milestones

    factory = functools.partial(make, total=P.TOTAL_UPDATE_STEPS, milestones=[P.NUM_EPOCHS, P.NUM_EPOCHS * 2])
    assert contains_placeholders(factory) and not contains_placeholders(functools.partial(make, total=3))
    assert resolve_partial(factory, VALUES)("opt") == ("opt", 21, [3, 6])


def test_placeholders_refuse_non_numbers_and_unknown_values() -> None:
    with pytest.raises(TrainerError, match="numbers or placeholders"):
        P.NUM_EPOCHS * "x"  # type: ignore[operator]
    with pytest.raises(TrainerError, match="no length"):
        resolve(P.NUM_UPDATE_STEPS_PER_EPOCH, {})


@pytest.mark.parametrize(
    ("epochs", "max_steps", "batches", "accumulation", "expected"),
    [
        (3, None, 10, 1, (3, 10, 30)),
        (3, None, 10, 4, (3, 3, 9)),  # ceil(10 / 4)
        (2, 5, 10, 3, (2, 4, 5)),  # max_steps first
        (None, 10, 10, 4, (4, 3, 10)),  # epochs from max_steps, rounded up
    ],
)
def test_run_numbers_follow_batches_accumulation_and_limits(
    epochs: int | None, max_steps: int | None, batches: int, accumulation: int, expected: tuple[int, int, int]
) -> None:
    got = placeholder_values(epochs, max_steps, batches, accumulation)
    assert (got[P.NUM_EPOCHS], got[P.NUM_UPDATE_STEPS_PER_EPOCH], got[P.TOTAL_UPDATE_STEPS]) == expected


def test_dataloader_lengths_are_placeholders_too() -> None:
    got = placeholder_values(2, None, 10, 4, eval_batches=3)
    assert (got[P.TRAIN_DATALOADER_LEN], got[P.EVAL_DATALOADER_LEN]) == (10, 3)
    assert resolve(P.TRAIN_DATALOADER_LEN * 7 + P.EVAL_DATALOADER_LEN, got) == 73
    with pytest.raises(TrainerError, match="no test dataloader"):
        resolve(P.EVAL_DATALOADER_LEN, placeholder_values(2, None, 10, 1))
