"""The hook bus: the registered hooks in the order they run, and the dispatch of each event.

A hook's exception does not simply propagate: with several ranks it is kept until the next
safe point, where every rank agrees to raise (:mod:`ember.trainer._control`). A
:class:`~ember.trainer.StopTraining` becomes a stop request there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ember.errors import HookError
from ember.trainer._control import note
from ember.trainer.hooks.base import EVENTS, BaseHook, StopTraining, check_hook, takes_trainer

if TYPE_CHECKING:
    from ember.logging import DistributedLogger
    from ember.trainer._control import Agreement


class HookBus:
    """Ordered hooks, and the call of each event on those that handle it.

    Args:
        logger: where the exceptions of ``after_train`` after the first are logged.
        agreement: what a hook's exception or :class:`~ember.trainer.StopTraining` is reported to.
    """

    def __init__(self, logger: DistributedLogger, agreement: Agreement) -> None:
        self.logger = logger
        self.agreement = agreement
        self.hooks: list[BaseHook] = []
        self._calls: dict[str, list[tuple[BaseHook, Callable[..., Any]]]] = {e: [] for e in EVENTS}
        self._update_batch: list[tuple[BaseHook, Callable[..., Any], str]] = []
        self._hold: Callable[[], None] | None = None
        self.ending_error: Exception | None = None
        """The first exception a hook raised in ``after_train`` (:meth:`call_all`) in this fit."""

    def reset(self) -> None:
        """Forget the ``after_train`` error of an earlier ``fit``."""
        self.ending_error = None

    def register(self, hooks: Sequence[BaseHook], owner: Any) -> None:
        """Check, name, order and attach ``hooks``, then call their ``after_hook_is_attached``."""
        if isinstance(hooks, BaseHook) or not isinstance(hooks, Sequence):
            raise HookError(f"hooks must be a list of hooks, got {type(hooks).__name__}")
        seen: set[int] = set()
        for hook in hooks:
            check_hook(hook)
            if id(hook) in seen:
                raise HookError(f"hook {hook.name!r} was passed twice: pass each hook instance once")
            seen.add(id(hook))
        _resolve_names(hooks)
        _check_records(hooks)
        self.hooks = [h for _, h in sorted(enumerate(hooks), key=lambda ih: (ih[1].priority, ih[0]))]
        for hook in self.hooks:
            hook._attach(owner)
        handled = [(h, frozenset(h.events())) for h in self.hooks]
        self._calls = {e: [(h, _bound(h, e)) for h, events in handled if e in events] for e in EVENTS}
        # A batch that applied an update: its after_train_iter and after_update calls in one
        # priority order (a hook's own after_train_iter first), as one event would run them.
        self._update_batch = [(h, _bound(h, e), e) for h, events in handled
                              for e in ("after_train_iter", "after_update") if e in events]  # fmt: skip
        self.call("after_hook_is_attached")

    def snapshot(self) -> tuple[Any, ...]:
        """The current hooks, to put back with :meth:`restore` (``evaluate(hooks=...)``)."""
        return self.hooks, self._calls, self._update_batch

    def restore(self, saved: tuple[Any, ...]) -> None:
        """Put back hooks saved by :meth:`snapshot` (they are attached already)."""
        self.hooks, self._calls, self._update_batch = saved

    def describe(self) -> str:
        """The resolved order, one hook a line, with the events each one handles."""
        if not self.hooks:
            return "no hooks"
        lines = [f"  {h.priority:>3}  {h.name:<24} {', '.join(e for e in h.events() if e != 'after_hook_is_attached')}"
                 for h in self.hooks]  # fmt: skip
        return "hooks, in the order they run (priority, name, events):\n" + "\n".join(lines)

    def handles(self, event: str) -> bool:
        """Whether any hook handles ``event`` (the loop skips the call of one that none does)."""
        return bool(self._calls[event])

    def hold_until(self, ready: Callable[[], None]) -> None:
        """Call ``ready()`` (once) before the next hook runs, in this event or a later one.

        For work that must end before a hook could change what it reads: the background copy
        of an ``async_save`` checkpoint (a hook may change the parameters in place).
        """
        self._hold = ready

    def _release(self) -> None:
        ready, self._hold = self._hold, None
        if ready is not None:
            ready()

    def call(self, event: str, *args: Any) -> None:
        """Run ``event`` on every hook that handles it, in order (see the module docstring)."""
        for hook, method in self._calls[event]:
            if self._hold is not None:  # also between two hooks: the first may have set it
                self._release()
            try:
                method(*args)
            except StopTraining as stop:
                self.agreement.request_stop(str(stop) or f"{hook.name} raised StopTraining in {event}")
            except Exception as exc:  # noqa: BLE001 - re-raised here or at the next safe point
                self.agreement.fail(exc, f"{hook.name}.{event}")

    def call_batch_end(self, applied: bool, output: Any, label: Any, loss: Any) -> None:
        """End a training batch: ``after_train_iter(output, label, loss)`` on every hook, and when
        the batch ``applied`` an optimizer update, ``after_update()`` too, all in priority order
        (see ``hooks/base.py``)."""
        if not applied:
            self.call("after_train_iter", output, label, loss)
            return
        for hook, method, event in self._update_batch:
            if self._hold is not None:
                self._release()
            try:
                if event == "after_update":
                    method()
                else:
                    method(output, label, loss)
            except StopTraining as stop:
                self.agreement.request_stop(str(stop) or f"{hook.name} raised StopTraining in {event}")
            except Exception as exc:  # noqa: BLE001 - re-raised here or at the next safe point
                self.agreement.fail(exc, f"{hook.name}.{event}")

    def call_all(self, event: str) -> Exception | None:
        """Run ``event`` on every hook even if some raise; return the first exception.

        The first one is also :attr:`ending_error` as soon as it is raised, so the hooks that
        run after it see how the fit ends (``trainer.fit_outcome``).
        """
        first: Exception | None = None
        for hook, method in self._calls[event]:
            if self._hold is not None:
                self._release()
            try:
                method()
            except StopTraining:
                continue
            except Exception as exc:  # noqa: BLE001 - returned to the caller, which raises it
                where = f"{hook.name}.{event}"
                note(exc, f"raised by hook {where}")
                if first is None:
                    first = self.ending_error = exc
                else:
                    self.logger.error(f"{where} also raised {exc!r}")
        return first


def _bound(hook: BaseHook, event: str) -> Callable[..., Any]:
    """``hook.<event>``, with the (weakly referenced) trainer bound first when the method takes it."""
    method = getattr(hook, event)
    return functools.partial(method, hook.trainer) if takes_trainer(hook, event) else method


def _check_records(hooks: Sequence[BaseHook]) -> None:
    """No two hooks may record the same history metric (the later would silently overwrite)."""
    owner: dict[str, BaseHook] = {}
    for hook in hooks:
        for metric in hook.records():
            first = owner.setdefault(metric, hook)
            if first is not hook:
                raise HookError(
                    f"hooks {first.name!r} and {hook.name!r} both record {metric!r}: each epoch the second would "
                    "overwrite the first. Keep one of them, or let each measure its own phase (on='train' / "
                    "on='test'); a MetricHook records under the metric name it is given"
                )


def _resolve_names(hooks: Sequence[BaseHook]) -> None:
    explicit: dict[str, BaseHook] = {}
    for hook in hooks:
        name = hook._explicit_name
        if name is not None:
            if name in explicit:
                raise HookError(f"two hooks are named {name!r}: hook names must be unique (they key checkpoints)")
            explicit[name] = hook
    counts: dict[str, int] = {}
    for hook in hooks:
        hook._resolved_name = None
        if hook._explicit_name is not None:
            continue
        base = type(hook).__name__
        counts[base] = counts.get(base, 0) + 1
        name = base if counts[base] == 1 else f"{base}#{counts[base]}"
        while name in explicit:
            counts[base] += 1
            name = f"{base}#{counts[base]}"
        hook._resolved_name = name
