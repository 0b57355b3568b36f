"""A real Slurm (scripts/slurm.sh: slurmctld + slurmd, one node with 2 CPUs, on loopback).

``srun -n 2 python job.py`` with ``launch_from_slurm``, and ``sbatch`` of
``examples/slurm/ember_run.sbatch`` (``ember run`` agents under ``srun``, here two tasks on the
one node standing for two machines), both train the job of the one-agent torchrun reference.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.dist import ROOT, free_port
from tests.launch.common import JOB, assert_same_training, job_env, reports

SLURM_CONF = os.environ.get("EMBER_TEST_SLURM_CONF")
pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(not SLURM_CONF, reason="$EMBER_TEST_SLURM_CONF not set (scripts/slurm.sh start prints it)"),
]
EXAMPLE = ROOT / "examples" / "slurm" / "ember_run.sbatch"


def slurm(cmd: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command against the test cluster."""
    cwd.mkdir(parents=True, exist_ok=True)
    assert SLURM_CONF is not None
    return subprocess.run(cmd, cwd=cwd, env=job_env(SLURM_CONF=SLURM_CONF, **env), capture_output=True, text=True,
                          timeout=240)  # fmt: skip


def test_srun_two_tasks_with_launch_from_slurm_train_the_torchrun_job(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    job = [sys.executable, str(JOB), str(tmp_path / "out"), "--launcher", "slurm", "--port", str(free_port())]
    cmd = ["srun", "--ntasks=2", "--cpus-per-task=1", "--kill-on-bad-exit=1", "--job-name=ember-srun", *job]
    proc = slurm(cmd, tmp_path / "node")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    got = reports(tmp_path / "out")
    assert {r["world_size"] for r in got.values()} == {2}
    assert_same_training(got, reference["reports"])


def wait_for_job(job_id: str, cwd: Path, timeout: float = 240) -> str:
    """Poll the job until it ends (``sbatch --wait`` backs off to many seconds); return its end as
    ``"STATE ExitCode=N:S"``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fields = slurm(["scontrol", "show", "job", job_id, "--oneliner"], cwd).stdout.split()
        state = next((f for f in fields if f.startswith("JobState=")), "JobState=?")
        if state.split("=")[1] in ENDED:
            return f"{state} {next(f for f in fields if f.startswith('ExitCode='))}"
        time.sleep(0.2)
    slurm(["scancel", job_id], cwd)
    raise AssertionError(f"Slurm job {job_id} did not end within {timeout} s")


ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def test_sbatch_of_the_ember_run_example_trains_the_torchrun_job(tmp_path: Path, reference: dict[str, Any]) -> None:
    log = tmp_path / "slurm.out"
    cmd = ["sbatch", "--parsable", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--cpus-per-task=1",
           f"--output={log}", str(EXAMPLE), str(JOB), str(tmp_path / "out")]  # fmt: skip
    proc = slurm(cmd, tmp_path / "node", EMBER_NPROC_PER_NODE="1", EMBER_RDZV_PORT=str(free_port()))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    end = wait_for_job(proc.stdout.strip().split(";")[0], tmp_path / "node")
    output = log.read_text() if log.exists() else ""
    assert end == "JobState=COMPLETED ExitCode=0:0", f"{end}\n{output[-6000:]}"
    got = reports(tmp_path / "out")
    assert {r["world_size"] for r in got.values()} == {2}
    assert len({r["restart"] for r in got.values()}) == 1
    assert_same_training(got, reference["reports"])
