"""The reference every launcher is compared with: the job on 2 processes of one ``ember run``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.launch.common import checkpoints, ember_run, finish, reports


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``ember run job.py --nproc 2`` (torchrun, one agent): its reports and checkpoint names."""
    root = tmp_path_factory.mktemp("reference")
    proc = ember_run(root / "node", root / "out", "--nproc", "2")
    output = finish(proc)
    assert proc.returncode == 0, output[-6000:]
    found = reports(root / "out")
    assert sorted(found) == [0, 1] and found[0]["world_size"] == 2
    return {"reports": found, "checkpoints": checkpoints(root / "node" / "ckpt"), "root": Path(root)}
