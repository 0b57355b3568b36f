"""pytorch-accelerated 0.1.61's own test suite, run against ``ember.compat.pytorch_accelerated``.

Every test of the public API runs. The tests below are set aside, each for the reason given
(the same list is in docs/migrating.md): they patch or call pytorch-accelerated's private
methods (``_run_train_epoch``, ``_perform_forward_and_backward_passes``, ``_accelerator``...),
which ember's Trainer does not have because ember's loop runs the epoch, or they build a
Trainer from mocks where a model, an optimizer or a DataLoader is required (ember builds its
Engine from the model when the Trainer is built, as accelerate does only in ``train``).
Equivalent checks of the same public behaviour with real objects are in
``tests/seeds/test_pytorch_accelerated.py``.
"""

from __future__ import annotations

import pytest

PRIVATE = "patches or calls pytorch-accelerated's private methods ({}), which ember's loop replaces"
MOCKS = "builds the Trainer or its DataLoader from mocks where a model/optimizer/DataLoader is required"

SET_ASIDE: dict[str, str] = {
    "test_trainer.py::test_skip_eval_if_not_present": PRIVATE.format("_run_train_epoch, _run_eval_epoch"),
    "test_trainer.py::test_skip_scheduler_step_if_not_present": MOCKS,
    "test_trainer.py::test_can_override_train_dataloader_kwargs": MOCKS,
    "test_trainer.py::test_can_override_eval_dataloader_kwargs": MOCKS,
    "test_trainer.py::test_gradient_accumulation_with_num_items_in_batch": PRIVATE.format(
        "_perform_forward_and_backward_passes"
    ),
    "test_trainer.py::test_gradient_accumulation_no_scaling_without_distributed": PRIVATE.format(
        "_perform_forward_and_backward_passes"
    ),
    "test_trainer.py::test_check_eval_batch_size_is_transparent_on_single_process": PRIVATE.format(
        "_check_eval_batch_size"
    ),
    "test_trainer.py::test_check_eval_batch_size_is_transparent_with_full_batches_for_all_processes": PRIVATE.format(
        "_check_eval_batch_size"
    ),
    "test_trainer.py::test_check_eval_batch_size_raises_batch_size_bigger_than_dataset": PRIVATE.format(
        "_check_eval_batch_size"
    ),
    "test_trainer.py::test_check_eval_batch_size_raises_empty_node_on_last_batch": PRIVATE.format(
        "_check_eval_batch_size"
    ),
    "test_trainer.py::test_check_eval_batch_size_warns_padding_is_needed": PRIVATE.format("_check_eval_batch_size"),
    "test_trainer.py::test_run_config_per_process": PRIVATE.format("_accelerator, _create_run_config"),
    "test_trainer.py::test_max_steps_stops_training_correctly": PRIVATE.format("_accelerator") + "; " + MOCKS,
    "test_trainer.py::test_max_steps_overrides_num_epochs": PRIVATE.format("_accelerator") + "; " + MOCKS,
    "test_trainer.py::test_no_max_steps_completes_all_epochs": PRIVATE.format("_accelerator") + "; " + MOCKS,
    "test_trainer.py::test_train_resume_from_sets_epoch": PRIVATE.format("_run_training"),
    "test_utils.py::test_can_limit_batches_with_manager": MOCKS,
    "test_utils.py::test_limit_batches_not_present_outside_manager": MOCKS,
}
"""Test (node id below this folder, or a class) -> why it is set aside."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests of :data:`SET_ASIDE` (reported by pytest as deselected)."""
    here = "tests/peers/pytorch_accelerated/"
    keep, drop = [], []
    for item in items:
        _, ours, local = item.nodeid.partition(here)
        aside = bool(ours) and any(local == key or local.startswith(key + "::") for key in SET_ASIDE)
        (drop if aside else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
