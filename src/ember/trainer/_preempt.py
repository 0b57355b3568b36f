"""Preemption: SIGTERM/SIGINT during ``fit`` end training after the current optimizer update.

While ``fit`` runs with a :class:`~ember.trainer.hooks.CheckpointHook`, the first SIGTERM or
SIGINT only sets a flag. At the next safe point (the end of an optimizer update, or of an
epoch) the ranks agree on it in the exchange they make there anyway (so one rank receiving the
signal is enough; with several ranks that exchange is read at the next one, spaced by time, see
:mod:`ember.trainer._control`), save a checkpoint, run ``after_train`` and leave ``fit`` with
:class:`Preempted`, a :class:`SystemExit` whose code is :data:`PREEMPTED_EXIT_CODE`.

A later signal exits at once with ``128 + signal number`` and saves nothing — unless it comes
within :data:`REPEAT_WINDOW_S` of the first: launchers (torchrun, Slurm) often deliver the same
signal twice, once to the process group and once forwarded, and that must not lose the save.
The previous handlers are put back when ``fit`` returns. A signal that arrived too late to act
on (``fit`` was ending anyway) is delivered again to the restored handler.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ember.logging import DistributedLogger
    from ember.trainer._control import Agreement

__all__ = ["PREEMPTED_EXIT_CODE", "REPEAT_WINDOW_S", "Preempted", "preemption_signals"]

PREEMPTED_EXIT_CODE = 75
"""The exit code of a preempted ``fit`` (``EX_TEMPFAIL``: saved, stopped; run again to resume).

Distinct from 143/130 (what a shell reports for a process killed by SIGTERM/SIGINT without
saving) and from 1 (an error)."""

REPEAT_WINDOW_S = 2.0
"""Seconds after the first signal during which a repeated signal is taken as the same one."""

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(SystemExit):
    """Raised by ``fit`` after a preemption signal: the state was saved and ``after_train`` ran.

    Uncaught, the process exits with :data:`PREEMPTED_EXIT_CODE`; catch it to do more first.

    Example:
        >>> try:
        ...     trainer.fit(train_dl, epochs=10, hooks=[hooks.CheckpointHook("ckpt")], resume="auto")
        ... except Preempted as stop:
        ...     print(stop.reason, stop.path); raise
    """

    def __init__(self, reason: str, path: Any = None) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.reason = reason
        """What was received, and on which rank."""
        self.path = path
        """The checkpoint saved on preemption (rank 0), or None."""

    def __str__(self) -> str:
        return f"training was preempted ({self.reason}); exit code {PREEMPTED_EXIT_CODE}"


class _Handler:
    def __init__(self, control: Agreement) -> None:
        self.control = control
        self.received: int | None = None
        self.first_at = 0.0

    def __call__(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if self.received is None:
            self.received, self.first_at = signum, now
            self.control.request_preempt(f"received {signal.Signals(signum).name}")
            return
        if now - self.first_at <= REPEAT_WINDOW_S:
            return  # the same signal, delivered again by a launcher
        # Logging could deadlock inside a signal handler: write the one line directly.
        os.write(2, f"ember: second {signal.Signals(signum).name}: exiting now without saving\n".encode())
        os._exit(128 + signum)


@contextlib.contextmanager
def preemption_signals(control: Agreement, logger: DistributedLogger, enabled: bool) -> Iterator[None]:
    """Handle SIGTERM/SIGINT as preemption inside the block (main thread only; else a no-op)."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = _Handler(control)
    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    ok = False
    try:
        yield
        ok = True
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
    if ok and handler.received is not None and not control.preempted:
        logger.warning(f"{signal.Signals(handler.received).name} arrived as fit was ending: passing it on")
        signal.raise_signal(handler.received)
