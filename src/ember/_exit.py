"""Leaving a torch.distributed process group at interpreter exit without an abort.

A gloo worker thread finishes a collective by dropping its reference to the tensors, which
needs the GIL when Python still knows them (any tensor passed in from Python). The main thread
returns from ``wait()`` first and may reach interpreter finalization before that thread got the
GIL (it waits up to the 5 ms switch interval, longer when descheduled on a busy machine);
CPython 3.11 then ends the thread with ``pthread_exit``, whose unwinding through a ``noexcept``
destructor calls ``std::terminate``: "terminate called without an active exception" and
SIGABRT after the script had finished (about 1 in 20 two-process runs on a loaded 2-core
machine). It happens with a plain ``init_process_group`` script too, so ``ember.launch``
registers the settle below, and so does ``ember.track`` when it finds a process group that
ember did not create.

This module imports nothing heavy: ``ember.track`` loads it without importing torch.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from pathlib import Path

SETTLE_S = 1.0
"""The longest the exit handler waits for other threads to settle."""

_registered = False


def leave_process_group_at_exit() -> None:
    """Register (once per process) the exit handler that destroys the group and settles."""
    global _registered
    if not _registered:
        _registered = True
        atexit.register(_leave_process_group)


def _leave_process_group() -> None:
    """At interpreter exit: destroy the process group, then let the backend's threads settle.

    Sleeping releases the GIL to a thread waiting for it; the loop ends once no other thread
    of the process is runnable on two checks in a row (bounded by :data:`SETTLE_S`).
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    settle_native_threads(SETTLE_S)


def settle_native_threads(limit_s: float) -> None:
    """Sleep in 2 ms steps until no other thread is runnable twice in a row, or ``limit_s``."""
    deadline = time.monotonic() + limit_s
    quiet = 0
    while quiet < 2 and time.monotonic() < deadline:
        time.sleep(0.002)  # releases the GIL: a thread waiting for it takes it now
        quiet = 0 if _other_threads_runnable() else quiet + 1


def _other_threads_runnable() -> bool:
    """Whether a thread of this process other than the caller is running or runnable (Linux)."""
    me = str(threading.get_native_id())
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:  # not Linux: the sleeps alone
        return False
    for tid in tids:
        if tid == me:
            continue
        try:
            stat = Path("/proc/self/task", tid, "stat").read_text()
        except OSError:  # the thread has just exited
            continue
        if stat.rpartition(")")[2].split()[0] == "R":
            return True
    return False
