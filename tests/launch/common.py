"""Start ``scripts/job.py`` under the launchers the multi-node tests exercise, and compare what ranks report.

Every "machine" is a process tree on loopback: an ``ember run`` agent (or ``srun``/``mpirun``
task, or a pod's command) with its own working folder, so node-local files (checkpoints, the
tracking store) land where that machine would write them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.dist import ROOT

JOB = Path(__file__).parent / "scripts" / "job.py"
TOL = 1e-6
# Variables a launcher sets for its workers: none may leak from the test's own environment.
LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "EMBER_RESUME", "EMBER_HOME", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")  # fmt: skip


def job_env(**extra: str) -> dict[str, str]:
    """The environment of a launched job: ember importable, one thread, no launcher variables."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith(("PET_", "SLURM_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])  # `ember` for srun
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def start(cmd: list[str], cwd: Path, **env: str) -> subprocess.Popen[str]:
    """Start one "machine": ``cmd`` in ``cwd``, in a session of its own, output captured."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(cmd, cwd=cwd, env=job_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip


def ember_run(cwd: Path, out: Path, *options: str, job_args: tuple[str, ...] = (), **env: str) -> subprocess.Popen[str]:
    """``ember run scripts/job.py OPTIONS -- OUT JOB_ARGS`` as one machine."""
    cmd = [sys.executable, "-m", "ember.cli", "run", str(JOB), *options, "--", str(out), *job_args]
    return start(cmd, cwd, **env)


def finish(proc: subprocess.Popen[str], timeout: float = 240) -> str:
    """Wait for a machine's command; return its output. On a timeout, kill its processes and fail."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        kill_machine(proc)
        output = proc.communicate()[0]
        raise AssertionError(f"{proc.args} did not finish within {timeout} s\n{output[-6000:]}") from None


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts its workers in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def kill_machine(proc: subprocess.Popen[str]) -> list[int]:
    """SIGKILL a machine's command and everything it started, at once: a node that vanishes."""
    victims = [proc.pid, *descendants(proc.pid)]
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return victims


def wait_for(path: Path, procs: list[subprocess.Popen[str]], timeout: float = 120) -> None:
    """Wait until ``path`` exists; fail early, with their output, when a machine ends first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        ended = [p for p in procs if p.poll() is not None]
        if ended or time.monotonic() > deadline:
            for p in procs:
                kill_machine(p)
            outputs = "\n".join(f"--- {p.args}\n{p.communicate()[0][-4000:]}" for p in procs)
            raise AssertionError(f"{path} did not appear (ended early: {[p.args for p in ended]})\n{outputs}")
        time.sleep(0.1)


def wait_for_port(port: int, procs: list[subprocess.Popen[str]], timeout: float = 60) -> None:
    """Wait until something listens on loopback ``port`` (an agent hosting the rendezvous)."""
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            outputs = "\n".join(f"--- {p.args}\n{finish(p, 5)[-4000:]}" for p in procs)
            raise AssertionError(f"nothing listens on port {port}\n{outputs}")
        time.sleep(0.1)


def reports(out: Path) -> dict[int, dict[str, Any]]:
    """What each rank of the job wrote at its end, by rank."""
    found = {}
    for path in out.glob("rank*.json"):
        report = json.loads(path.read_text())
        report["losses"] = {int(step): loss for step, loss in report["losses"].items()}
        found[report["rank"]] = report
    return found


def assert_same_training(got: dict[int, dict[str, Any]], ref: dict[int, dict[str, Any]], tol: float = TOL) -> None:
    """Every rank's per-update losses, and the final parameters, within ``tol`` of the reference's."""
    assert sorted(got) == sorted(ref), f"ranks {sorted(got)} reported, expected {sorted(ref)}"
    for rank, report in ref.items():
        losses = got[rank]["losses"]
        assert sorted(losses) == sorted(report["losses"]), f"rank {rank} logged other updates"
        worst = max(abs(losses[s] - report["losses"][s]) for s in losses)
        assert worst <= tol, f"rank {rank}: a loss differs by {worst:.3g}"
    params = [x for tensor in got[0]["params"] for x in tensor]
    ref_params = [x for tensor in ref[0]["params"] for x in tensor]
    assert len(params) == len(ref_params)
    worst = max(abs(a - b) for a, b in zip(params, ref_params, strict=True))
    assert worst <= tol, f"a final parameter differs by {worst:.3g}"


def runs(home: Path) -> list[dict[str, Any]]:
    """The ``run.json`` of every tracked run in the store ``home``."""
    return [json.loads(p.read_text()) for p in sorted(home.glob("runs/*/run.json"))]


def checkpoints(folder: Path) -> list[str]:
    """The checkpoint names in ``folder`` (none when it does not exist)."""
    return sorted(p.name for p in folder.glob("ckpt-*")) if folder.is_dir() else []
