"""The runs open in this process: finished at interpreter exit, forgotten in forked children."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Protocol


class _Closable(Protocol):
    def _end(self, exc: BaseException | None) -> None: ...

    def _forget_after_fork(self) -> None: ...


_live: dict[int, _Closable] = {}
_lock = threading.Lock()
_hooks_installed = False


def register(run: _Closable) -> None:
    """Remember an open run (and install the exit and fork hooks once)."""
    global _hooks_installed
    with _lock:
        _live[id(run)] = run
        if not _hooks_installed:
            atexit.register(finish_all_at_exit)
            if hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=_after_fork_in_child)
            _hooks_installed = True


def unregister(run: _Closable) -> None:
    """Forget a run that has been finished."""
    with _lock:
        _live.pop(id(run), None)


def is_open(path: object) -> bool:
    """Whether a run with folder ``path`` is open in this process."""
    with _lock:
        runs = list(_live.values())
    return any(getattr(r, "path", None) == path for r in runs)


def exit_exception() -> BaseException | None:
    """The uncaught exception that is ending the program, if any."""
    return getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)


def finish_all_at_exit() -> None:
    """Finish every open run; errors are raised after all runs had their turn."""
    exc = exit_exception()
    with _lock:
        runs = list(_live.values())
    errors: list[Exception] = []
    for run in runs:
        try:
            run._end(exc)  # the run maps the exception to its status
        except Exception as e:  # noqa: BLE001 - every run must be finished; re-raised below
            errors.append(e)
    if errors:
        raise errors[0]


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    for run in list(_live.values()):
        run._forget_after_fork()
    _live.clear()
