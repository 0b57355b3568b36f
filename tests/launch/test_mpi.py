"""A real Open MPI (Debian's openmpi-bin, scripts/mpi.sh): ``mpirun -np 2 python job.py`` with
``launch_from_openmpi`` trains the job of the one-agent torchrun reference."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.dist import free_port
from tests.launch.common import JOB, assert_same_training, job_env, reports

MPIRUN = os.environ.get("EMBER_TEST_MPIRUN") or shutil.which("mpirun")
pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(MPIRUN is None, reason="no mpirun (scripts/mpi.sh installs Open MPI)"),
]


def test_mpirun_two_processes_with_launch_from_openmpi_train_the_torchrun_job(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    assert MPIRUN is not None
    root = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {}
    cmd = [MPIRUN, "-np", "2", "--oversubscribe", "--bind-to", "none", sys.executable, str(JOB),
           str(tmp_path / "out"), "--launcher", "openmpi", "--port", str(free_port())]  # fmt: skip
    (tmp_path / "node").mkdir()
    proc = subprocess.run(cmd, cwd=tmp_path / "node", env=job_env(**root), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    got = reports(tmp_path / "out")
    assert {r["world_size"] for r in got.values()} == {2}
    assert_same_training(got, reference["reports"])
