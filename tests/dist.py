"""Run a test script under torchrun (gloo, CPU) and report what every rank printed.

Multi-process tests pay ~several seconds of torchrun start-up each, so group what they check
into few scripts.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(
    script: str | Path,
    nproc: int = 2,
    args: list[str] | tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 180,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with ``torch.distributed.run`` on ``nproc`` local processes.

    Raises AssertionError with both output streams when ``check`` and the exit code is not 0.
    """
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc_per_node={nproc}", "--nnodes=1",
        "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        str(script), *args,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"torchrun exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc


def results(proc: subprocess.CompletedProcess[str]) -> dict[int, dict]:
    """The JSON objects that ranks printed on lines starting with ``RESULT `` keyed by rank."""
    out: dict[int, dict] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            obj = json.loads(line[len("RESULT ") :])
            out[int(obj["rank"])] = obj
    return out
