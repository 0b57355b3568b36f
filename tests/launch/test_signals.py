"""``ember run`` and signals: SIGTERM passed on and 75 when the workers saved, the first failing
worker named with its signal, a worker that never ends named and (``--finish-timeout``) stopped.

The ordering tests watch real child processes with :class:`ember._supervisor.Watcher` and build
torchrun's failure report by hand, so the moments of death are real without a launch; the two
launches use a script that imports nothing heavy (about 3 s each).
"""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from ember import _run_report, _supervisor
from tests.launch.common import job_env

# A worker that saves (here: sleeps) and exits with the preemption code on SIGTERM, as a preempted
# fit does; with `hang`, rank 1 never ends and ignores SIGTERM for 0.3 s, then exits by it.
WORKER = """
import os, signal, sys, time
rank = os.environ["RANK"]
def preempted(signum, frame):
    time.sleep(0.3)
    sys.exit(75)
if sys.argv[2] == "save":
    signal.signal(signal.SIGTERM, preempted)
elif rank == "0":
    sys.exit(0)
open(os.path.join(sys.argv[1], "ready." + rank), "w").close()
time.sleep(120)
"""


def _ember_run(tmp_path: Path, mode: str, *options: str) -> subprocess.Popen[str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return subprocess.Popen(
        [sys.executable, "-m", "ember", "run", "--nproc", "2", *options, str(script), str(tmp_path), mode],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=job_env(),
    )  # fmt: skip


def _wait_for(paths: list[Path], proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in paths):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.05)


@pytest.mark.multiprocess
def test_sigterm_to_ember_run_reaches_the_workers_and_their_preemption_code_is_its_exit_code(tmp_path: Path) -> None:
    proc = _ember_run(tmp_path, "save", "--shutdown-timeout", "20")
    _wait_for([tmp_path / "ready.0", tmp_path / "ready.1"], proc)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 75, out
    assert out.rstrip().splitlines()[-1] == (
        "ember run: received SIGTERM and passed it on to the workers: rank(s) 0, 1 saved a checkpoint and exited "
        "with 75 (preempted); run the job again to resume"
    )
    assert "Traceback" not in out and "SignalException" not in out


@pytest.mark.multiprocess
def test_a_worker_still_running_after_the_others_finished_is_stopped_by_finish_timeout(tmp_path: Path) -> None:
    proc = _ember_run(tmp_path, "hang", "--finish-timeout", "0.5")
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == _supervisor.FINISH_TIMEOUT_EXIT, out
    assert "still running 0.5 s after rank(s) 0 finished with exit code 0 (--finish-timeout)" in out
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("ember run: stopped after --finish-timeout 0.5 s") and "rank 1 (local rank 1, pid " in last
    assert last.endswith("ended by SIGTERM"), last


Watched = tuple[_supervisor.Watcher, list[subprocess.Popen[bytes]]]


@pytest.fixture
def watched(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Watched]:
    """A watcher over two real child processes standing for ranks 0 and 1 (start records as workers write
    them); ``@pytest.mark.parametrize("watched", [[cmd0, cmd1]], indirect=True)`` gives their commands."""
    commands = getattr(request, "param", [["sleep", "30"], ["sleep", "30"]])
    children = [subprocess.Popen(command) for command in commands]
    for rank, child in enumerate(children):
        record = {"rank": rank, "local_rank": rank, "pid": child.pid}
        (tmp_path / f"0-{rank}.start").write_text(json.dumps(record))
    watcher = _supervisor.Watcher(tmp_path, finish_timeout=None)
    watcher.start()
    deadline = time.monotonic() + 10
    while len(watcher.current()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    yield watcher, children
    watcher.close()
    for child in children:
        child.kill()
        child.wait()


def _ended(watcher: _supervisor.Watcher, child: subprocess.Popen[bytes]) -> float:
    deadline = time.monotonic() + 10
    while (worker := watcher.by_pid(child.pid)) is None or worker.ended_at is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    return worker.ended_at


def _failure(tmp_path: Path, rank: int, pid: int, exitcode: int, raised_at: float | None = None) -> ProcessFailure:
    """torchrun's record of a failed worker; ``raised_at`` writes the error file ember's worker leaves on a raise."""
    error_file = tmp_path / f"error-{rank}-{exitcode}-{raised_at}.json"
    if raised_at is not None:
        info = {"py_callstack": f"Traceback of {rank}\n", "timestamp": str(int(raised_at)), "ember_time": raised_at}
        error_file.write_text(json.dumps({"message": {"message": "E", "extraInfo": info}}))
    return ProcessFailure(local_rank=rank, pid=pid, exitcode=exitcode, error_file=str(error_file))


def test_a_worker_killed_by_a_signal_is_named_not_the_peer_that_raised_or_was_stopped_after_it(
    tmp_path: Path, watched: Watched
) -> None:
    watcher, (zero, one) = watched
    one.send_signal(signal.SIGKILL)  # the OOM killer, say; rank 0 loses its peer in a collective...
    died = _ended(watcher, one)
    zero.send_signal(signal.SIGTERM)  # ...raises, and is stopped by the launcher while it exits
    _ended(watcher, zero)
    # gloo raises within a millisecond of the death, the launcher sees the death a few (more when
    # loaded): a raise just before or after the moment seen is the consequence
    for raised_at in (died + 0.002, died - 0.005):
        failures = {
            0: _failure(tmp_path, 0, zero.pid, -signal.SIGTERM, raised_at=raised_at),
            1: _failure(tmp_path, 1, one.pid, -signal.SIGKILL),
        }
        text, code = _run_report.failure_report(ChildFailedError("train.py", failures), watcher)
        assert code == 128 + signal.SIGKILL
        assert text == (
            f"ember run: rank 1 (local rank 1, pid {one.pid}) failed with exit code 137, killed by signal 9 "
            "(SIGKILL); rank 0 failed after it"
        )
    earlier = {  # a raise seconds before the death came first
        0: _failure(tmp_path, 0, zero.pid, 1, raised_at=died - 2 * _run_report.SIGNAL_SLACK_S),
        1: _failure(tmp_path, 1, one.pid, -signal.SIGKILL),
    }
    assert _run_report.failure_report(ChildFailedError("train.py", earlier), watcher)[1] == 1
    by_segv = {1: _failure(tmp_path, 1, one.pid, -signal.SIGSEGV), 0: _failure(tmp_path, 0, zero.pid, -15)}
    assert _run_report.failure_report(ChildFailedError("t.py", by_segv), watcher) == (
        f"ember run: rank 1 (local rank 1, pid {one.pid}) failed with exit code 139, killed by signal 11 (SIGSEGV); "
        "ember run stopped 1 other worker",
        139,
    )


def test_a_worker_that_raised_and_was_stopped_while_exiting_gives_exit_code_1_not_143(
    tmp_path: Path, watched: Watched
) -> None:
    watcher, (zero, one) = watched
    raised = time.time()
    time.sleep(0.01)
    one.send_signal(signal.SIGTERM)  # stopped by the launcher after rank 0's error, which then takes long to exit
    _ended(watcher, one)
    zero.send_signal(signal.SIGTERM)
    _ended(watcher, zero)
    failures = {0: _failure(tmp_path, 0, zero.pid, -15, raised_at=raised), 1: _failure(tmp_path, 1, one.pid, -15)}
    text, code = _run_report.failure_report(ChildFailedError("train.py", failures), watcher)
    assert code == 1
    assert text.startswith(f"ember run: rank 0 (local rank 0, pid {zero.pid}) failed with exit code 1; ember run ")


@pytest.mark.parametrize("watched", [[["true"], ["sleep", "30"]]], indirect=True)
def test_a_worker_still_running_after_the_other_finished_is_named_in_a_warning(
    watched: Watched, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _, (_, one) = watched
    monkeypatch.setattr(_supervisor, "STRAGGLER_WARNING_S", 0.2)
    caplog.set_level(logging.WARNING, logger="ember")
    deadline = time.monotonic() + 10
    while not caplog.records and time.monotonic() < deadline:
        time.sleep(0.02)
    (record,) = caplog.records
    assert re.match(
        rf"rank 1 \(local rank 1, pid {one.pid}\) still running \d+ s after rank\(s\) 0 finished with exit code 0\. "
        "If it hangs",
        record.getMessage(),
    )
    assert "--finish-timeout SECONDS" in record.getMessage() and one.poll() is None  # a warning only


# A launcher that starts one worker, which asks for SIGTERM when the launcher dies and reports it.
LAUNCHER = """
import os, subprocess, sys, time
os.environ["EMBER_RUN_LAUNCHER_PID"] = str(os.getpid())
worker = '''
import os, signal, sys, time
from ember._worker import follow_launcher
def report(*_):
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write("SIGTERM")
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])  # whole when it appears: the test reads it at once
    sys.exit(75)
signal.signal(signal.SIGTERM, report)
follow_launcher()
open(sys.argv[1] + ".ready", "w").close()
time.sleep(60)
'''
subprocess.Popen([sys.executable, "-c", worker, sys.argv[1]])
time.sleep(60)
"""


def test_workers_get_sigterm_when_ember_run_is_killed_with_sigkill(tmp_path: Path) -> None:
    report = tmp_path / "worker-got"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(report)], env=job_env())
    deadline = time.monotonic() + 30
    while not report.with_name("worker-got.ready").exists():
        assert time.monotonic() < deadline and launcher.poll() is None
        time.sleep(0.02)
    launcher.kill()  # SIGKILL: nothing of the launcher runs
    launcher.wait()
    while not report.exists():  # the worker saves (here: writes) and stops instead of living on, orphaned
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert report.read_text() == "SIGTERM"
