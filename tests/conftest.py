"""Shared fixtures: every test starts with no launched ember context and one torch thread."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _fresh_ember_context():
    """Tear down any context a test launched, so tests stay independent."""
    yield
    from ember import context as ctx

    ctx.reset()
