"""Shared fixtures: every test starts with no launched ember context and one torch thread.

The suite is written for the CPU (CI has no GPU, and bit-identity needs one device on both
sides), so on a machine with GPUs it hides them, from this process and its children, unless the
run selects the ``cuda`` tests (``pytest -m cuda tests/cuda``).
"""

from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(1)


def pytest_configure(config: pytest.Config) -> None:
    if config.option.markexpr.strip() != "cuda":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


@pytest.fixture(autouse=True)
def _fresh_ember_context():
    """Tear down any context a test launched, so tests stay independent."""
    yield
    from ember import context as ctx

    ctx.reset()
