"""The 4-process torchrun that ``test_equivalence.py`` and ``test_grid_equivalence.py`` both read
(one launch for both: ``scripts/four_ranks.py``), and the folder its grid runs write into."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.dist import torchrun

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture(scope="session")
def four_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the 4-process grid runs (``scripts/grid_four.py``) leave their states and checkpoints."""
    return tmp_path_factory.mktemp("grid4")


@pytest.fixture(scope="session")
def four(four_out: Path) -> dict[int, dict[str, Any]]:
    res = torchrun(SCRIPTS / "four_ranks.py", nproc=4, timeout=300, env={"EMBER_GRID_OUT": str(four_out)}).results
    assert sorted(res) == [0, 1, 2, 3]
    return res
