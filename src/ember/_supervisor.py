"""What ``ember run`` knows of its workers: when each started and ended, and how.

torchrun's agent polls its workers every 0.1 s and stops the others in the poll that finds a
failure, so its report cannot tell which worker failed first (it lists them by rank); after a
signal to the launcher it keeps no exit code at all; and a worker that never ends while the
others finished keeps it waiting forever. ``ember run`` therefore watches its workers itself:

- each worker (:mod:`ember._worker`) writes a start record (rank, local rank, attempt, pid) into
  the launcher's private status folder (``$EMBER_RUN_STATUS_DIR``) before the script runs, and an
  exit record (the code the script ended with) when the script ends through Python; it also
  asks the kernel for SIGTERM when the launcher dies (``_worker.follow_launcher``);
- the launcher's :class:`Watcher` thread notes the moment each worker ends (a pidfd wakes it at
  once on Linux; elsewhere it looks every 50 ms) and how: the kernel's status, read with
  ``waitid(WNOWAIT)``, which leaves the process for torchrun to collect.

From these, :mod:`ember._run_report` names the first worker that failed and how, and says how the
workers ended after ``ember run`` received SIGTERM/SIGINT; the watcher warns about, and with
``--finish-timeout`` ends, workers still running after another one finished. The rules are in
docs/launch.md ("Signals and exit codes").
"""

from __future__ import annotations

import _thread
import contextlib
import json
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ember._lock import pid_alive
from ember._worker import LAUNCHER_ENV, STATUS_ENV, record_path

PREEMPTED = 75
"""A preempted worker's exit code (``ember.trainer.PREEMPTED_EXIT_CODE``, not imported: the
trainer is too heavy for the launcher), which ``ember run`` passes on."""

FINISH_TIMEOUT_EXIT = 124
"""``ember run``'s exit code when ``--finish-timeout`` stopped a worker (as GNU ``timeout``'s)."""

STRAGGLER_WARNING_S = 60.0
"""Seconds after a worker finished with 0 before the others still running are named in a warning."""

POLL_S = 0.05
"""How often the watcher looks for new workers (and, without pidfds, for ended ones)."""

KILL_WAIT_S = 5.0
"""How long the launcher waits to see workers end after SIGKILL (one stuck in the kernel may not)."""

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_log = logging.getLogger("ember")


# --- in the launcher ------------------------------------------------------------------------


@dataclass
class Worker:
    """One worker process as the launcher saw it."""

    rank: int
    local_rank: int
    attempt: int
    pid: int
    ended_at: float | None = None
    """``time.time()`` when the watcher saw the process end (None while it runs)."""
    status: int | None = None
    """The kernel's exit status: the exit code, or ``-N`` for a death by signal N (None: not seen)."""
    exit_code: int | None = None
    """What the script ended with through Python (its exit record), if it did."""
    exit_time: float | None = None
    """When the script ended through Python (``time.time()`` in the worker, from its exit record)."""
    sent: set[int] = field(default_factory=set)
    """The signals ``ember run`` sent it."""

    @property
    def outcome(self) -> int | None:
        """What the script ended with (its exit record), else the kernel's status, else None.

        The record wins: a worker that saved and exited with 75 but was killed while its exit
        handlers ran (a process group that would not close) did save.
        """
        return self.exit_code if self.exit_code is not None else self.status

    def name(self) -> str:
        return f"rank {self.rank} (local rank {self.local_rank}, pid {self.pid})"


class Watcher(threading.Thread):
    """The launcher's thread that follows the workers (see the module docstring).

    Args:
        folder: the status folder (``$EMBER_RUN_STATUS_DIR`` of the workers).
        finish_timeout: seconds after a worker of this machine finished with exit code 0 after
            which the workers still running are stopped (``--finish-timeout``); None waits.
    """

    def __init__(self, folder: Path, finish_timeout: float | None) -> None:
        super().__init__(name="ember-run-watcher", daemon=True)
        self.folder = folder
        self.finish_timeout = finish_timeout
        self.workers: dict[tuple[int, int], Worker] = {}
        self.timed_out: list[Worker] = []
        """The workers ``--finish-timeout`` stopped."""
        self.stopping_at: float | None = None
        """When ``ember run`` started stopping its workers after a signal."""
        self._lock = threading.RLock()  # the main thread's signal handler may interrupt a holder
        self._done = threading.Event()
        self._warned: set[int] = set()

    def close(self) -> None:
        """Stop the thread (it releases its pidfds)."""
        self._done.set()
        if self.is_alive():
            self.join()

    def run(self) -> None:
        poller = select.poll() if hasattr(select, "poll") and hasattr(os, "pidfd_open") else None
        pidfds: dict[int, int] = {}
        try:
            while not self._done.is_set():
                self.refresh()
                if poller is not None:
                    self._follow(poller, pidfds)
                if poller is not None and pidfds:
                    poller.poll(POLL_S * 1000)  # returns at once when a worker ends
                else:
                    self._done.wait(POLL_S)
                self._check_finish(time.time())
        finally:
            for fd in pidfds.values():
                os.close(fd)

    def _follow(self, poller: Any, pidfds: dict[int, int]) -> None:
        """Keep one pidfd (readable once the process ends) per running worker in ``poller``."""
        with self._lock:
            running = {w.pid for w in self.workers.values() if w.ended_at is None}
        for pid in set(pidfds) - running:
            fd = pidfds.pop(pid)
            poller.unregister(fd)
            os.close(fd)
        for pid in running - set(pidfds):
            with contextlib.suppress(OSError):  # already gone: the next probe sees it
                pidfds[pid] = os.pidfd_open(pid)
                poller.register(pidfds[pid], select.POLLIN)

    def refresh(self) -> None:
        """Add the workers whose start records appeared, note those that ended, read their exit records."""
        now = time.time()
        with self._lock:
            self._discover()
            for worker in self.workers.values():
                if worker.ended_at is None:
                    self._probe(worker, now)
                if worker.ended_at is not None and worker.exit_code is None:
                    record = _read(record_path(self.folder, worker.attempt, worker.rank, "exit"))
                    if isinstance(record.get("code"), int):
                        worker.exit_code = record["code"]
                        when = record.get("time")
                        worker.exit_time = float(when) if isinstance(when, int | float) else None

    def current(self) -> list[Worker]:
        """The workers of the latest attempt, by rank."""
        self.refresh()
        with self._lock:
            latest = max((w.attempt for w in self.workers.values()), default=0)
            return sorted((w for w in self.workers.values() if w.attempt == latest), key=lambda w: w.rank)

    def by_pid(self, pid: int) -> Worker | None:
        with self._lock:
            return next((w for w in self.workers.values() if w.pid == pid), None)

    def forward(self, signum: int, again: bool = True) -> None:
        """Send ``signum`` to every worker still running (its process group, as torchrun does).

        ``again=False`` skips the workers that were sent it already.
        """
        for worker in self.current():
            if worker.ended_at is None and (again or signum not in worker.sent):
                worker.sent.add(signum)
                _signal(worker.pid, signum)

    def stop_workers(self, signum: int, grace_s: float) -> None:
        """Send ``signum`` to the running workers, wait up to ``grace_s`` for them, then SIGKILL the rest.

        Workers whose start records appear meanwhile get the signal too.
        """
        for sig, wait_s in ((signum, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
            deadline = time.monotonic() + wait_s
            while True:
                self.forward(sig, again=False)
                if all(w.ended_at is not None for w in self.current()):
                    return
                if time.monotonic() >= deadline:
                    break
                time.sleep(POLL_S)

    def _discover(self) -> None:
        """Add the workers whose start records appeared (under the lock)."""
        try:
            names = [p.name for p in self.folder.iterdir() if p.name.endswith(".start")]
        except OSError:
            return
        for name in names:  # record_path's names: ATTEMPT-RANK.start
            attempt, _, rank = name.removesuffix(".start").partition("-")
            if not (attempt.isdigit() and rank.isdigit()) or (int(attempt), int(rank)) in self.workers:
                continue
            record = _read(self.folder / name)
            if isinstance(record.get("pid"), int):
                local = record.get("local_rank")
                self.workers[int(attempt), int(rank)] = Worker(
                    int(rank), local if isinstance(local, int) else 0, int(attempt), record["pid"]
                )

    def _probe(self, worker: Worker, now: float) -> None:
        """Whether ``worker`` ended, without collecting it (torchrun does that)."""
        try:
            info = os.waitid(os.P_PID, worker.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            # torchrun collected it first (the time is still right to a poll), or it is not a child
            # of this process (a PYTHON_EXEC wrapper that forks the interpreter): then it runs
            # while it exists
            if not pid_alive(worker.pid):
                worker.ended_at = now
            return
        if info is not None:
            worker.ended_at = now
            worker.status = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def _check_finish(self, now: float) -> None:
        """Warn about, or stop (``--finish-timeout``), workers still running after one finished with 0."""
        workers = self.current()
        finished = [w for w in workers if w.ended_at is not None and w.outcome == 0]
        running = [w for w in workers if w.ended_at is None]
        if not finished or not running or self.timed_out or self.stopping_at is not None:
            return
        since = min(w.ended_at or now for w in finished)
        names = ", ".join(w.name() for w in running)
        done = ", ".join(str(w.rank) for w in finished)
        if self.finish_timeout is not None and now - since >= self.finish_timeout:
            self.timed_out = running
            _log.warning(
                f"{names} still running {self.finish_timeout:g} s after rank(s) {done} finished with exit code 0 "
                "(--finish-timeout): ember run stops the job"
            )
            _thread.interrupt_main(signal.SIGTERM)  # the main thread stops the workers, as on a SIGTERM
        elif now - since >= STRAGGLER_WARNING_S and running[0].attempt not in self._warned:
            self._warned.add(running[0].attempt)
            _log.warning(
                f"{names} still running {now - since:.0f} s after rank(s) {done} finished with exit code 0. "
                "If it hangs, stop the job (Ctrl-C, or kill -TERM "
                f"{os.getpid()}), or pass --finish-timeout SECONDS to end such a job by itself"
            )


def _signal(pid: int, signum: int) -> None:
    """Send ``signum`` to a worker's process group when it leads one (torchrun starts each worker
    in a session of its own: its data-loader processes get it too), else to the worker alone."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):  # gone meanwhile, or not ours to signal: nothing to stop
        return


def _read(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


class _StopHandler:
    """``ember run``'s SIGTERM/SIGINT handler: the first stops the workers, later ones are passed on.

    The first signal is sent to every worker (its process group); the handler waits, in the
    main thread, up to ``grace_s`` for them to end (noting how each ended before torchrun can
    collect it: torchrun's agent runs in this thread), kills those still running with SIGKILL,
    then raises torchelastic's ``SignalException``, on which torchrun's agent shuts down as it
    does on a signal of its own. A repeated signal is sent on to the workers at once (ember's
    trainer then exits without saving if it comes more than 2 s after the first) and the wait
    goes on.
    """

    def __init__(self, watcher: Watcher, grace_s: float) -> None:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        self.watcher, self.grace_s = watcher, grace_s
        self.exception = SignalException

    def __call__(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.watcher.stopping_at is not None:
            # Logging could deadlock inside a signal handler: write the one line directly.
            os.write(2, f"ember run: {name} again: passed on to the workers still running\n".encode())
            self.watcher.forward(signum)
            return
        self.watcher.stopping_at = time.time()
        os.write(2, f"ember run: {name}: passed on to the workers; waiting up to {self.grace_s:g} s\n".encode())
        self.watcher.stop_workers(signum, self.grace_s)
        raise self.exception(f"ember run received {name}", sigval=signal.Signals(signum))


def torch_signals(signals: str) -> str:
    """torchrun's ``--signals-to-handle`` without SIGTERM and SIGINT, which :func:`supervised` handles.

    torchelastic registers its handler for these at every start of the workers, over any other.
    """
    names = {s.name for s in STOP_SIGNALS}
    return ",".join(s.strip() for s in signals.split(",") if s.strip() and s.strip() not in names) or "SIGHUP"


@contextlib.contextmanager
def supervised(folder: Path, finish_timeout: float | None, grace_s: float) -> Iterator[Watcher]:
    """Watch the workers of the ``torchrun.run`` inside the block, and handle SIGTERM/SIGINT meanwhile.

    Sets ``$EMBER_RUN_STATUS_DIR`` (for the workers), starts the :class:`Watcher` and installs
    :class:`_StopHandler`; everything is put back when the block ends. torchrun must be told to
    leave these signals alone (:func:`torch_signals`).
    """
    os.environ[STATUS_ENV] = str(folder)
    os.environ[LAUNCHER_ENV] = str(os.getpid())
    watcher = Watcher(folder, finish_timeout)
    previous = {sig: signal.signal(sig, _StopHandler(watcher, grace_s)) for sig in STOP_SIGNALS}
    watcher.start()
    try:
        yield watcher
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        watcher.close()
        os.environ.pop(STATUS_ENV, None)
        os.environ.pop(LAUNCHER_ENV, None)
