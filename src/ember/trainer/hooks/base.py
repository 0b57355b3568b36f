"""The hook base class, priorities, and the checks a hook passes when it is registered.

When each method runs, as the Trainer's loop in pseudo-code (``fit``)::

    hook.after_hook_is_attached()            # at registration, in order
    try:
        before_train()
        while epochs and steps remain and nobody stopped:
            before_train_epoch()               # not repeated when resuming mid-epoch
            for batch in train_dataloader:
                before_train_iter()
                result = train_step(batch)     # forward + loss
                engine.backward(result["loss"]); applied = engine.step()
                after_train_iter(output, label, loss)   # every batch (micro-step)
                after_update()                 # only if applied: once per optimizer update,
                                               # not on accumulation micro-steps nor on a
                                               # skipped fp16 step (ordered with the above:
                                               # see below)
                if this batch closed an accumulation cycle:   # a safe point
                    agree across ranks: stop / error?        # and max_steps reached?
            if a test is due this epoch:       # every test_interval epochs and at the end
                before_test()
                before_test_epoch()
                for batch in test_dataloader:  # padded repeats of the sampler dropped
                    before_test_iter()
                    result = eval_step(batch)
                    after_test_iter(output, label, loss)
                after_test_epoch()             # metric hooks reduce across ranks here
                after_test()
            after_train_epoch()                # sees this epoch's train *and* test metrics
        after_train_loop()                     # the loop ended without an error (finished,
                                               # stopped or preempted): the CheckpointHook
                                               # saves the final state here
    finally:
        after_train()                          # also when training raised

``evaluate()`` runs only the test part. Within one event, hooks run by :attr:`priority`
(lower first), ties in registration order; the Trainer logs the resolved order at fit start.

Per batch or per update: ``after_train_iter`` sees every batch (accumulate a batch's
outputs there); ``after_update`` only the batches whose ``engine.step()`` changed the
parameters, with ``trainer.cur_step`` already counting the update. Work done once per
optimizer update (log every N steps, step an LR schedule, save every N steps) belongs in
``after_update``: it is detectron2's ``after_step``, Hugging Face's ``on_step_end`` and
ignite's ``ITERATION_COMPLETED`` (an iteration there is one update). On such a batch the two
events run as one, in priority order, a hook's own ``after_train_iter`` before its
``after_update``: so moving per-update work from ``after_train_iter`` (behind an
``if trainer.step_applied``) to ``after_update`` keeps the order the hooks ran in. The metric
hooks (``ABOVE_NORMAL``) have put the batch's loss in the step storage before the writers
(``BELOW_NORMAL``) read it, and a hook at ``LOWEST`` sees the LR schedule stepped.
"""

from __future__ import annotations

import difflib
import enum
import inspect
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ember.errors import HookError

if TYPE_CHECKING:
    from ember.trainer.trainer import Trainer

__all__ = ["EVENTS", "BaseHook", "Priority", "StopTraining", "check_hook", "get_priority", "takes_trainer"]

EVENTS: tuple[str, ...] = (
    "after_hook_is_attached",
    "before_train", "after_train_loop", "after_train",
    "before_train_epoch", "after_train_epoch",
    "before_train_iter", "after_train_iter", "after_update",
    "before_test", "after_test",
    "before_test_epoch", "after_test_epoch",
    "before_test_iter", "after_test_iter",
)  # fmt: skip
"""Every lifecycle method name, the only public ``before_*``/``after_*`` names a hook may have."""

_ITER_ARGS = ("output", "label", "loss")
_EVENT_ARGS: dict[str, tuple[str, ...]] = {"after_train_iter": _ITER_ARGS, "after_test_iter": _ITER_ARGS}

# Names from other libraries that users bring along, mapped to ember's event.
_FOREIGN: dict[str, str] = {
    "on_train_start": "before_train", "on_fit_start": "before_train",
    "on_train_end": "after_train", "on_fit_end": "after_train",
    "on_train_epoch_start": "before_train_epoch", "on_epoch_start": "before_train_epoch",
    "on_train_epoch_end": "after_train_epoch", "on_epoch_end": "after_train_epoch",
    "on_train_batch_start": "before_train_iter", "before_step": "before_train_iter",
    "on_train_batch_end": "after_train_iter", "after_step": "after_update",
    "on_step_end": "after_update", "after_optimizer_step": "after_update", "on_after_optimizer_step": "after_update",
    "after_iteration": "after_update", "on_iteration_completed": "after_update",
    "on_validation_start": "before_test", "on_test_start": "before_test", "before_val": "before_test",
    "on_validation_end": "after_test", "on_test_end": "after_test", "after_val": "after_test",
    "on_validation_epoch_start": "before_test_epoch", "before_val_epoch": "before_test_epoch",
    "on_validation_epoch_end": "after_test_epoch", "after_val_epoch": "after_test_epoch",
    "on_validation_batch_start": "before_test_iter", "before_val_iter": "before_test_iter",
    "on_validation_batch_end": "after_test_iter", "after_val_iter": "after_test_iter",
}  # fmt: skip


class StopTraining(Exception):
    """Raise from a hook to end training cleanly after the current optimizer update.

    Equivalent to ``self.trainer.stop(reason)``; the remaining hooks of the event still run,
    the epoch closes (``after_train_epoch``), and ``after_train`` runs. ``fit`` returns normally.

    Example:
        >>> class StopAt(BaseHook):
        ...     def after_train_iter(self, output, label, loss):
        ...         if self.trainer.cur_step >= 500:
        ...             raise StopTraining("enough")
    """


class Priority(enum.IntEnum):
    """Named priority levels; lower runs first within an event, ties keep registration order.

    Any int from 0 to 100 is allowed too. The built-in hooks use: EMA ``HIGH`` (updates the
    averaged weights before anything reads them), metrics ``ABOVE_NORMAL`` (fill the history
    before it is read), early stopping ``NORMAL``, logging ``BELOW_NORMAL`` (logs the learning
    rate the step used), LR scheduler ``LOW`` (steps after the logs), progress bar ``VERY_LOW``.
    """

    HIGHEST = 0
    VERY_HIGH = 10
    HIGH = 30
    ABOVE_NORMAL = 40
    NORMAL = 50
    BELOW_NORMAL = 60
    LOW = 70
    VERY_LOW = 90
    LOWEST = 100


def get_priority(priority: int | str | Priority) -> int:
    """Turn a :class:`Priority`, its name (``"HIGH"``) or an int 0-100 into the int.

    Raises:
        HookError: an unknown name, or a number outside 0-100.
    """
    if isinstance(priority, str):
        try:
            return int(Priority[priority.upper()])
        except KeyError:
            names = ", ".join(p.name for p in Priority)
            raise HookError(f"unknown hook priority {priority!r}: use one of {names} or an int 0-100") from None
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 100:
        raise HookError(f"hook priority must be an int 0 (runs first) to 100, or a Priority name; got {priority!r}")
    return int(priority)


class BaseHook:
    """A piece of optional training behaviour, called at the Trainer's lifecycle events.

    Override the lifecycle methods you need (see this module's docstring for when each runs);
    reach the trainer through :attr:`trainer` (a weak reference: a hook never keeps a trainer
    alive), or let a lifecycle method take it as its first argument, as Colossal-AI's and
    mmengine's hooks do (``def after_train_iter(self, trainer, output, label, loss)``). A hook
    with state returns it from :meth:`state_dict` and takes it back in :meth:`load_state_dict`,
    so checkpoints resume it under its :attr:`name`.

    Args:
        priority: when this hook runs relative to others in the same event (lower first):
            a :class:`Priority`, its name, or an int 0-100. Default: the class attribute
            ``priority`` (``NORMAL`` unless a subclass sets it).
        name: a stable name for logs and checkpoints. Default: the class name; when two hooks
            have the same default name the later ones get ``#2``, ``#3``... in registration
            order. Give explicit names when several hooks of one class carry state.

    Example:
        >>> class PrintLoss(BaseHook):
        ...     def after_train_iter(self, output, label, loss):
        ...         if self.trainer.cur_step % 100 == 0:
        ...             print(self.trainer.cur_step, loss.item())
        >>> trainer.fit(train_dl, epochs=3, hooks=[PrintLoss(priority="LOW")])
    """

    priority: int = Priority.NORMAL
    state_per_rank: bool = False
    """True when each rank's :meth:`state_dict` differs (e.g. running sums over its own shard):
    checkpoints then keep every rank's state and give each rank its own back. False (the
    default): rank 0's state is saved and every rank loads it."""
    _explicit_name: str | None = None
    _resolved_name: str | None = None
    _trainer_ref: Any = None

    def __init__(self, priority: int | str | Priority | None = None, name: str | None = None) -> None:
        if priority is not None:  # else the class attribute (NORMAL unless a subclass sets it)
            self.priority = get_priority(priority)
        if name is not None and (not isinstance(name, str) or not name):
            raise HookError(f"hook name must be a non-empty str, got {name!r}")
        self._explicit_name = name

    @property
    def name(self) -> str:
        """The name in logs and checkpoints: explicit, else the class name (``#2``... on clashes)."""
        return self._resolved_name or self._explicit_name or type(self).__name__

    # -- the trainer -------------------------------------------------------------------------
    @property
    def trainer(self) -> Trainer:
        """The Trainer this hook is registered with (a weak proxy)."""
        if self._trainer_ref is None:
            raise HookError(f"hook {self.name!r} is not registered with a Trainer: pass it to trainer.fit(hooks=[...])")
        return self._trainer_ref

    def _attach(self, trainer: Trainer) -> None:
        self._trainer_ref = weakref.proxy(trainer)

    # -- lifecycle: all optional -------------------------------------------------------------
    def after_hook_is_attached(self) -> None:
        """Called once when the hook is registered (``fit``/``evaluate`` with it in ``hooks``)."""

    def before_train(self) -> None:
        """Called once at the start of ``fit``."""

    def after_train(self) -> None:
        """Called once at the end of ``fit``, also when training raised (in ``finally``)."""

    def after_train_loop(self) -> None:
        """Called once when ``fit``'s loop ends without an error, before any ``after_train``.

        The loop finished, was stopped, or the ranks agreed on a preemption
        (``trainer.preempted``): the state is the one ``fit`` ends with. The CheckpointHook
        saves it here (``save_last``, or always on a preemption); a hook that changes the model
        in ``after_train`` (swapping in averaged weights) runs after that save.
        """

    def before_train_epoch(self) -> None:
        """Called at the start of each training epoch."""

    def after_train_epoch(self) -> None:
        """Called at the end of each epoch, after its test pass (if any)."""

    def before_train_iter(self) -> None:
        """Called before each training batch (micro-step)."""

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Called after each training batch, with its output, label and (undivided) loss.

        ``trainer.step_result`` is the whole dict ``train_step`` returned. For work done once
        per optimizer update, use :meth:`after_update` (ordered with this event: see the module
        docstring).
        """

    def after_update(self) -> None:
        """Called once per optimizer update, with the ``after_train_iter`` of the batch that made it.

        Not called on the micro-steps of gradient accumulation nor when an fp16 step was
        skipped (non-finite gradients): ``trainer.cur_step`` has just counted this update.
        The batch's output and loss are in ``trainer.step_result``; what metric hooks recorded
        for it is in ``trainer.storage``.

        Example:
            >>> class LogEvery100(BaseHook):
            ...     def after_update(self):
            ...         if self.trainer.cur_step % 100 == 0:
            ...             print(self.trainer.cur_step, self.trainer.storage.latest("train/loss"))
        """

    def before_test(self) -> None:
        """Called when a test pass starts (in ``fit`` or ``evaluate``)."""

    def after_test(self) -> None:
        """Called when a test pass ends."""

    def before_test_epoch(self) -> None:
        """Called before the first test batch."""

    def after_test_epoch(self) -> None:
        """Called after the last test batch: reduce metrics across ranks here."""

    def before_test_iter(self) -> None:
        """Called before each test batch."""

    def after_test_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Called after each test batch, padded repeats of the distributed sampler removed."""

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This hook's state for checkpoints (plain data and tensors). Stateless: ``{}``."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if state:
            raise HookError(
                f"hook {self.name!r} ({type(self).__name__}) keeps no state but was given {sorted(state)}: "
                "was the checkpoint written with a different hook under this name?"
            )

    def records(self) -> list[str]:
        """The history metrics this hook records (``["test/accuracy"]``); none by default.

        Checked when the hooks are registered: two hooks recording one name would overwrite
        each other every epoch, so that is an error. A hook that calls
        ``trainer.record_metric`` should list the names here.
        """
        return []

    def events(self) -> list[str]:
        """The lifecycle methods the Trainer calls on this hook: those its class overrides.

        A subclass may leave out a method its settings make a no-op (a metric hook that does not
        measure ``"train"`` drops ``after_train_iter``): the Trainer then skips that call every
        batch. Read once, when the hooks are registered.
        """
        return [e for e in EVENTS if getattr(type(self), e) is not getattr(BaseHook, e)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, priority={self.priority})"


_BASE_NAMES = frozenset(name for name in dir(BaseHook) if not name.startswith("_"))


def _suggestion(name: str) -> str:
    if name in _FOREIGN:
        return _FOREIGN[name]
    close = difflib.get_close_matches(name, EVENTS, n=1, cutoff=0.5)
    return close[0] if close else ""


def _looks_like_event(name: str) -> bool:
    return (
        name.startswith(("before_", "after_", "on_"))
        or name in _FOREIGN
        or bool(difflib.get_close_matches(name, EVENTS, n=1, cutoff=0.85))
    )


def check_hook(hook: Any) -> None:
    """Check a hook before it is registered.

    Rejects what is not a :class:`BaseHook`, a bad priority, a public method whose name looks
    like a lifecycle method but is not one (``after_train_itr``, ``on_train_epoch_end``: they
    would never be called), and lifecycle methods that cannot take the arguments the Trainer
    passes.

    Raises:
        HookError: naming the hook, the method, and what would be right.
    """
    if not isinstance(hook, BaseHook):
        raise HookError(
            f"hooks must be instances of ember.trainer.hooks.BaseHook subclasses, got {type(hook).__name__}: "
            "subclass BaseHook and override its lifecycle methods"
        )
    get_priority(hook.priority)
    cls = type(hook)
    for attr in dir(cls):
        if attr.startswith("_") or attr in _BASE_NAMES or not callable(getattr(cls, attr, None)):
            continue
        if _looks_like_event(attr):
            hint = _suggestion(attr)
            did_you_mean = f"did you mean {hint!r}? " if hint else ""
            raise HookError(
                f"{cls.__name__}.{attr} is not a lifecycle method and would never be called: {did_you_mean}"
                f"the lifecycle methods are {', '.join(EVENTS)} (prefix helpers with '_')"
            )
    for event in hook.events():
        if _trainer_first(getattr(hook, event), _EVENT_ARGS.get(event, ())) is None:
            args = _EVENT_ARGS.get(event, ())
            plain = f"({', '.join(args)})" if args else "() (no arguments besides self)"
            raise HookError(
                f"{cls.__name__}.{event} must accept {plain}, or the trainer first: ({', '.join(('trainer', *args))})"
            )


def takes_trainer(hook: BaseHook, event: str) -> bool:
    """Whether ``hook``'s ``event`` method takes the trainer as its first argument.

    Both forms are lifecycle methods: ``after_train_iter(self, output, label, loss)`` (reach the
    trainer through ``self.trainer``, as in detectron2) and ``after_train_iter(self, trainer,
    output, label, loss)`` (as in Colossal-AI and mmengine). A method whose first parameter is
    called ``trainer`` gets it; otherwise the arguments decide.
    """
    return bool(_trainer_first(getattr(hook, event), _EVENT_ARGS.get(event, ())))


def _trainer_first(method: Any, args: tuple[str, ...]) -> bool | None:
    """True: call ``method(trainer, *args)``; False: ``method(*args)``; None: it takes neither."""
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to inspect, call it plainly
        return False

    def binds(*values: Any) -> bool:
        try:
            signature.bind(*values)
        except TypeError:
            return False
        return True

    first = next(iter(signature.parameters.values()), None)
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if first is not None and first.name == "trainer" and first.kind in positional and binds(None, *args):
        return True
    if binds(*args):
        return False
    return True if binds(None, *args) else None
