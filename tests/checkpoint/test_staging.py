"""Saving fast: StagingBuffers (CPU copies for async saves, prepared ahead and reused)."""

from __future__ import annotations

import torch

from ember.checkpoint import state


def _tree() -> dict:
    big = torch.arange(3 * (1 << 20), dtype=torch.float32)  # 12 MB: copied in parallel chunks
    return {"model": {"w": big, "b": torch.ones(5)}, "opt": [torch.full((2, 3), 7.0), 3], "t": (torch.zeros(1),)}


def _ptrs(tree: dict) -> list[int]:
    return [tree["model"]["w"].data_ptr(), tree["model"]["b"].data_ptr(), tree["opt"][0].data_ptr()]


def test_copies_are_exact_and_independent_of_the_live_tensors() -> None:
    live, staging = _tree(), state.StagingBuffers()
    copied = state.to_cpu(live, staging)
    assert torch.equal(copied["model"]["w"], live["model"]["w"]) and copied["opt"][1] == 3
    live["model"]["w"].add_(1)  # training goes on
    assert torch.equal(copied["model"]["w"], torch.arange(3 * (1 << 20), dtype=torch.float32))
    assert copied["model"]["w"].data_ptr() != live["model"]["w"].data_ptr()


def test_prepared_buffers_are_used_by_the_first_save_and_reused_by_the_next() -> None:
    live, staging = _tree(), state.StagingBuffers()
    staging.prepare([live["model"]["w"], live["model"]["b"], live["opt"][0]])
    first = state.to_cpu(live, staging)
    prepared = {b.data_ptr() for bufs in [staging._used] for b in bufs}
    assert set(_ptrs(first)) <= prepared
    live["model"]["w"].mul_(2)
    second = state.to_cpu(live, staging)
    assert _ptrs(second) == _ptrs(first)  # the same memory, overwritten
    assert torch.equal(second["model"]["w"], live["model"]["w"])


def test_a_tensor_of_a_new_shape_gets_a_new_buffer_and_stale_ones_are_dropped() -> None:
    staging = state.StagingBuffers()
    state.to_cpu({"a": torch.ones(4)}, staging)
    out = state.to_cpu({"a": torch.ones(6), "b": torch.ones(4)}, staging)
    assert out["a"].shape == (6,) and torch.equal(out["b"], torch.ones(4))
    state.to_cpu({"c": torch.ones(2)}, staging)
    assert len(staging._used) == 1 and not staging._free
