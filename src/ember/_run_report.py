"""What ``ember run`` reports when its job ends early, and its exit code (docs/launch.md, "Signals and exit codes").

:func:`failure_report`: a worker failed (torchrun's ``ChildFailedError``); :func:`stop_report`:
``ember run`` received SIGTERM/SIGINT, or ``--finish-timeout`` expired. Both read what the
:class:`~ember._supervisor.Watcher` saw of the workers.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

from ember._supervisor import FINISH_TIMEOUT_EXIT, PREEMPTED, STOP_SIGNALS, Watcher, Worker

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

SIGNAL_SLACK_S = 1.0
"""How much earlier than seen a death by a signal other than SIGTERM/SIGINT counts (:func:`failure_report`)."""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def failure_report(failed: ChildFailedError, watcher: Watcher | None) -> tuple[str, int]:
    """The report of a failed job and the exit code to use: the first worker that failed, and how.

    The first failure is the one that happened first: a raise at the time in its error file
    (:mod:`ember._worker` writes it to the microsecond), an exit with a code at the time in its
    exit record, a death by signal at the moment the watcher saw the process end (torchrun's
    own time, to the second, for a worker the watcher never saw start). A death by a signal
    other than SIGTERM/SIGINT counts as :data:`SIGNAL_SLACK_S` earlier than seen: the moment a
    signal killed a process cannot be read afterwards, the watcher sees it a few milliseconds
    late (more on a loaded machine), and a peer waiting in a collective fails within one
    millisecond of that death; so a raise within a second of a SIGKILL or SIGSEGV seen on
    another worker is taken as its consequence (SIGTERM and SIGINT are how workers are stopped,
    a consequence themselves). Its exit code is the job's: 1 for an exception (even when the worker was then
    stopped during its exit), the code it exited with, or 128 + N for a death by signal N. The
    other workers either failed after it (they raised) or were stopped by ember run.
    Workers that all exited with the preemption code (75) make a preempted job, exit code 75.
    """
    failures = failed.failures

    def message(rank: int) -> dict[str, Any] | None:
        found = failures[rank].error_file_data.get("message")
        return found if isinstance(found, dict) else None

    def when(rank: int) -> tuple[float, int]:
        raised = message(rank)
        if raised is not None:
            extra = raised.get("extraInfo", {})
            return float(extra.get("ember_time", failures[rank].timestamp)), rank
        seen = watcher.by_pid(failures[rank].pid) if watcher is not None else None
        if seen is not None and seen.exit_time is not None:  # sys.exit(N): the worker's own clock
            return seen.exit_time, rank
        if seen is None or seen.ended_at is None:
            return float(failures[rank].timestamp), rank
        signum = -failures[rank].exitcode
        return seen.ended_at - (SIGNAL_SLACK_S if signum > 0 and signum not in STOP_SIGNALS else 0.0), rank

    if all(f.exitcode == PREEMPTED and message(r) is None for r, f in failures.items()):
        ranks = ", ".join(str(r) for r in sorted(failures))
        return (
            f"ember run: the workers were preempted: rank(s) {ranks} saved a checkpoint and exited with "
            f"{PREEMPTED}; run the job again to resume",
            PREEMPTED,
        )
    order = sorted(failures, key=when)
    rank = order[0]
    first = failures[rank]
    raised = message(rank)
    code = 1 if raised is not None else first.exitcode if first.exitcode > 0 else 128 - first.exitcode
    head = f"ember run: rank {rank} (local rank {first.local_rank}, pid {first.pid}) failed with exit code {code}"
    if raised is None and first.exitcode < 0:
        head += f", killed by signal {-first.exitcode} ({_signal_name(-first.exitcode)})"
    elif raised is None:
        head += " without an exception (sys.exit, os._exit or native code; its output is above)"
    after = [r for r in order[1:] if message(r) is not None]
    stopped = len(order) - 1 - len(after)
    if after:
        head += f"; rank{'s' if len(after) > 1 else ''} {', '.join(map(str, after))} failed after it"
    if stopped:
        head += f"; ember run stopped {stopped} other worker{'s' if stopped > 1 else ''}"
    if raised is None:
        return head, code
    body = raised.get("extraInfo", {}).get("py_callstack", first.message)
    return f"{head}. Its error:\n{str(body).rstrip()}", code


def stop_report(signum: int, watcher: Watcher, grace_s: float) -> tuple[str, int]:
    """The report after ``ember run`` received ``signum`` (or ``--finish-timeout`` expired), and the exit code.

    75 when every worker saved a checkpoint and exited with it (the others had finished with 0);
    0 when all had finished with 0; :data:`FINISH_TIMEOUT_EXIT` after ``--finish-timeout``;
    else 128 + ``signum``, naming each worker that did not save and how it ended.
    """
    workers = watcher.current()
    name = _signal_name(signum)
    if watcher.timed_out:
        names = ", ".join(f"{w.name()} {_ended(w, watcher, grace_s, saving=False)}" for w in watcher.timed_out)
        return (
            f"ember run: stopped after --finish-timeout {watcher.finish_timeout:g} s, the wait for workers "
            f"still running after another finished with exit code 0: {names}",
            FINISH_TIMEOUT_EXIT,
        )
    if not workers:
        return f"ember run: received {name} before any worker started; exit code {128 + signum}", 128 + signum
    if all(w.outcome in (0, PREEMPTED) for w in workers):
        saved = [str(w.rank) for w in workers if w.outcome == PREEMPTED]
        if not saved:
            return f"ember run: received {name} after every worker had finished with exit code 0", 0
        return (
            f"ember run: received {name} and passed it on to the workers: rank(s) {', '.join(saved)} saved a "
            f"checkpoint and exited with {PREEMPTED} (preempted); run the job again to resume",
            PREEMPTED,
        )
    unsaved = [f"{w.name()} {_ended(w, watcher, grace_s)}" for w in workers if w.outcome not in (0, PREEMPTED)]
    return (
        f"ember run: received {name} and passed it on to the workers, but not every worker saved a checkpoint "
        f"and exited with {PREEMPTED}: {'; '.join(unsaved)}. Exit code {128 + signum} ({name})",
        128 + signum,
    )


def _ended(worker: Worker, watcher: Watcher, grace_s: float, saving: bool = True) -> str:
    """How ``worker`` ended, in words (``saving``: it was asked to save and stop)."""
    outcome = worker.outcome
    if outcome is None:
        return "ended without an exit status ember run could see"
    if outcome >= 0:
        return f"exited with {outcome}"
    sig = _signal_name(-outcome)
    late = watcher.stopping_at is not None and (worker.ended_at or 0) - watcher.stopping_at >= 0.9 * grace_s
    if -outcome == signal.SIGKILL and late:
        return f"was killed with SIGKILL, still running {grace_s:g} s after the signal (--shutdown-timeout)"
    if -outcome in STOP_SIGNALS:
        return f"ended by {sig} without saving (no CheckpointHook in a running fit?)" if saving else f"ended by {sig}"
    return f"was killed by signal {-outcome} ({sig})"
