"""Every tracking test gets its own store under tmp_path (``EMBER_HOME``) and rank 0."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The store root for this test; runs a failing test left open are finished afterwards."""
    home = tmp_path / "store"
    monkeypatch.setenv("EMBER_HOME", str(home))
    monkeypatch.delenv("RANK", raising=False)
    yield home
    from ember.track import _live

    for run in list(_live._live.values()):
        run.finish("Failed")
