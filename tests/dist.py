"""Run a test script under torchrun (gloo, CPU) and collect what every rank reported.

Multi-process tests pay several seconds of torchrun start-up each, so group what they check
into few scripts. A script calls :func:`report` once per rank; the test reads
``torchrun(...).results`` keyed by rank.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class TorchrunResult:
    """Exit code, output streams and per-rank reports of one torchrun."""

    returncode: int
    stdout: str
    stderr: str
    results: dict[int, dict[str, Any]] = field(default_factory=dict)


def report(obj: dict[str, Any]) -> None:
    """Called inside a script: record this rank's findings for the test to read."""
    out = Path(os.environ["EMBER_TEST_OUT"])
    rank = int(os.environ.get("RANK", "0"))
    (out / f"rank{rank}.json").write_text(json.dumps({"rank": rank, **obj}))


def torchrun(
    script: str | Path,
    nproc: int = 2,
    args: list[str] | tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 180,
    check: bool = True,
    torchrun_args: tuple[str, ...] = (),
) -> TorchrunResult:
    """Run ``script`` with ``torch.distributed.run`` on ``nproc`` local processes.

    Raises AssertionError with both output streams when ``check`` and the exit code is not 0.
    """
    run = _torchrun_once(script, nproc, args, env, timeout, torchrun_args)
    if check and run.returncode != 0:
        raise AssertionError(f"torchrun exited {run.returncode}\n--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}")
    return run


def _torchrun_once(
    script: str | Path,
    nproc: int,
    args: list[str] | tuple[str, ...],
    env: dict[str, str] | None,
    timeout: float,
    torchrun_args: tuple[str, ...],
) -> TorchrunResult:
    with tempfile.TemporaryDirectory() as out:
        full_env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "EMBER_TEST_OUT": out,
            **(env or {}),
        }
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            f"--nproc_per_node={nproc}", "--nnodes=1",
            "--master_addr=127.0.0.1", f"--master_port={free_port()}", *torchrun_args,
            str(script), *args,
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
        results = {int(p.stem[4:]): json.loads(p.read_text()) for p in Path(out).glob("rank*.json")}
    return TorchrunResult(proc.returncode, proc.stdout, proc.stderr, results)


def results(run: TorchrunResult) -> dict[int, dict[str, Any]]:
    """Per-rank reports: those written by :func:`report`, plus ``RESULT {json}`` printed to stdout."""
    found = dict(run.results)
    decoder = json.JSONDecoder()
    text = run.stdout
    start = text.find("RESULT ")
    while start != -1:
        obj, end = decoder.raw_decode(text, start + len("RESULT "))
        found.setdefault(int(obj["rank"]), obj)
        start = text.find("RESULT ", end)
    return found
