"""How every rank agrees on stopping and on errors (the hooks' dispatch is :mod:`ember.trainer._bus`).

Collectives (gradient all-reduce, metric reductions) pair up only when every rank calls them
in the same order, so a rank must not leave the loop on its own. The rules:

* A hook that raises :class:`StopTraining` or calls ``trainer.stop()`` only sets a flag; so
  does a preemption signal (:mod:`ember.trainer._preempt`).
* In a one-process world an exception from a hook propagates at once. With several ranks the
  rank keeps the first exception, logs it, and goes on exactly as the other ranks do (so its
  collectives still match theirs) until the next *safe point*.
* Safe points are the end of every iteration that closed an accumulation cycle (once per
  optimizer update), the end of every epoch, and the end of ``evaluate``. There each rank
  contributes "stop, preemption or error here?" to one ``any_true`` (a one-element all-reduce);
  when any says yes, a second exchange tells every rank which rank asked and why (an error
  outranks a preemption, which outranks a stop). Then every rank raises (the failing one its
  own exception, the others a :class:`TrainerError` naming it) or leaves the loop (for a
  preemption, after saving a checkpoint); ``after_train`` runs on all of them.
* At the per-update safe points the all-reduce is started without waiting and read at the next
  such exchange (``agree(lagged=True)``), so no rank ever stalls on it. Exchanges are spaced
  about ``check_every_s`` of training apart (0.05 s by default; 0: after every update): each
  carries the ranks' time per update, and all ranks derive the next spacing, in updates, from
  the same all-reduced number, so they stay in step. A request made during update N thus
  takes effect on every rank at the same later update: N+1 with ``check_every_s=0``, else
  within about twice that interval. The requests are sticky, so the blocking safe points
  (epoch ends, ``evaluate``, ``after_train``) see every earlier one at once.

Cost: with several ranks, one small all-reduce per ``check_every_s`` of training that overlaps
the next update, and a blocking one per epoch; none with one rank (a request then takes effect
at once). On two gloo processes training a tiny MLP one exchange per update cost ~20% of the
step time: hence the spacing.
An exception raised inside the forward/backward pass itself cannot be agreed on (the other ranks
are already waiting in the gradient all-reduce): that case is left to the launcher, which stops
the remaining workers when one exits (torchrun does).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from ember import distributed
from ember.errors import TrainerError

if TYPE_CHECKING:
    from ember.logging import DistributedLogger


class Agreement:
    """The stop, preemption and error requests of this rank, and the safe points where all ranks agree on them."""

    def __init__(self, logger: DistributedLogger, check_every_s: float = 0.05) -> None:
        self.logger = logger
        self.check_every_s = check_every_s
        self.stop_requested = False
        self.stop_reason: str | None = None
        self.stopping = False
        self.preempted = False
        """Whether the ranks agreed to stop for a preemption signal (set at a safe point)."""
        self._preempt: str | None = None
        self._error: tuple[Exception, str] | None = None
        self._pending: distributed.PendingMax | None = None
        self._updates = 0  # lagged safe points passed
        self._exchange_at = 1  # the lagged safe point of the next exchange
        self._multi = False  # several ranks: read once per fit by reset(), the group cannot change within one
        self.must_agree = False
        """Whether a per-update safe point has anything to do: several ranks, or a request here.
        The loop skips ``agree(lagged=True)`` otherwise (a call per update on a tiny model)."""
        self._exchanged = (0, time.perf_counter())  # safe point and time of the last exchange

    def reset(self) -> None:
        """Forget stop requests and errors (at the start of ``fit``)."""
        self.stop_requested, self.stop_reason, self.stopping, self._error = False, None, False, None
        self.preempted, self._preempt, self._pending = False, None, None
        self._multi = self.must_agree = distributed.is_active()

    def request_stop(self, reason: str) -> None:
        """Ask every rank to stop at the next safe point."""
        if not self.stop_requested:
            self.stop_requested, self.stop_reason = True, reason
        self.must_agree = True

    def request_preempt(self, reason: str) -> None:
        """Ask every rank to save and stop at the next safe point (called from a signal handler)."""
        if self._preempt is None:
            self._preempt = reason
        self.must_agree = True

    def fail(self, exc: Exception, where: str) -> None:
        """Handle ``exc`` raised at ``where``: raise it now (one rank) or at the next safe point."""
        self._failed(exc, where)

    def _failed(self, exc: Exception, where: str) -> None:
        note(exc, f"raised by hook {where}")
        if not distributed.is_active():
            raise exc
        self.must_agree = True
        if self._error is None:
            self._error = (exc, where)
            self.logger.error(f"{where} raised {exc!r}; every rank stops at the next safe point")
        else:
            self.logger.error(f"{where} also raised {exc!r} (after {self._error[1]})")

    def agree(self, lagged: bool = False) -> bool:
        """A safe point: True when every rank is to stop now; raises on every rank on an error.

        ``lagged``: answer with what the ranks said at the previous lagged safe point and start
        this one's exchange without waiting for it (see the module docstring).
        """
        local = self.stop_requested or self._error is not None or self._preempt is not None
        if not (self._multi if lagged else distributed.is_active()):
            if not local:
                return False
            if self._preempt is not None:
                self._set_preempted(self._preempt)
        elif self._any_rank_asked(local, lagged):
            self._exchange()
        else:
            return False
        self.stopping = True
        return True

    def _any_rank_asked(self, local: bool, lagged: bool) -> bool:
        if not lagged:
            if self._pending is not None:
                self._pending.result()  # the requests are sticky: the exchange below repeats its answer
                self._pending = None
            return distributed.any_true(local)
        self._updates += 1
        if self._updates < self._exchange_at:
            return False
        last, since = self._exchanged
        now = time.perf_counter()
        per_update = (now - since) / max(1, self._updates - last)
        self._exchanged = (self._updates, now)
        previous, self._pending = self._pending, distributed.max_async([float(local), per_update])
        if previous is None:
            self._exchange_at = self._updates + 1
            return False
        asked, slowest = previous.result()  # the same numbers on every rank
        spacing = 1 if self.check_every_s <= 0 or slowest <= 0 else int(self.check_every_s / slowest)
        self._exchange_at = self._updates + min(max(1, spacing), 10_000)
        if not asked:
            return False
        self._pending.result()  # collected before the exchange that follows
        self._pending = None
        return True

    def _set_preempted(self, reason: str) -> None:
        self.preempted, self.stop_requested, self.stop_reason = True, True, f"preempted: {reason}"

    def _exchange(self) -> None:
        rank, world = distributed.rank(), distributed.world_size()
        codes = torch.zeros(world, dtype=torch.int32, device=distributed.collective_device())
        error, preempt = self._error is not None, self._preempt is not None
        codes[rank] = 3 if error else 2 if preempt else 1 if self.stop_requested else 0
        found = distributed.all_reduce(codes).tolist()
        worst = max(found)
        src = found.index(worst)
        mine = f"{self._error[1]} raised {self._error[0]!r}" if self._error is not None else self.stop_reason
        if worst == 2:
            mine = self._preempt
        message = distributed.broadcast_object(mine if rank == src else None, src=src)
        if worst == 3:
            if self._error is not None:
                raise self._error[0]
            raise TrainerError(f"training stopped on every rank because, on rank {src}, {message}")
        if worst == 2:
            self._set_preempted(f"rank {src} {message}")
        elif not self.stop_requested:
            self.stop_requested, self.stop_reason = True, f"rank {src}: {message}"


def note(exc: Exception, text: str) -> None:
    """Add ``text`` to ``exc``'s notes (once)."""
    if hasattr(exc, "add_note") and text not in getattr(exc, "__notes__", ()):
        exc.add_note(text)
