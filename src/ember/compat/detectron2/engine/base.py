"""detectron2's ``HookBase`` and ``TrainerBase``: hooks, their dispatch, and the loop a ``run_step``
of the user's own runs in.

The dispatch (``TrainerBase.before_step`` etc.: the detectron2 hooks in registration order) is
the one both loops use: detectron2's loop below calls it, and on ember's Trainer
(:class:`~ember.compat.detectron2.engine.simple.SimpleTrainer`) ember's events call it.
"""

from __future__ import annotations

import difflib
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ember.compat.detectron2.utils.events import EventStorage
from ember.errors import HookError, TrainerError
from ember.logging import get_dist_logger
from ember.trainer.hooks import BaseHook

__all__ = ["EVENTS", "HookBase", "TrainerBase", "check_range"]

EVENTS = ("before_train", "after_train", "before_step", "after_backward", "after_step")
"""detectron2's hook methods."""

_EMBER_NAMES = {"before_train_iter": "before_step", "after_train_iter": "after_step"}


class HookBase:
    """A detectron2 hook: override ``before_train``, ``after_train``, ``before_step``,
    ``after_backward``, ``after_step`` (all optional); reach the trainer as ``self.trainer``.

    When each runs (on ember's Trainer: see :mod:`ember.compat.detectron2.engine.simple`)::

        hook.before_train()
        for iter in range(start_iter, max_iter):
            hook.before_step()
            trainer.run_step()       # hook.after_backward() inside, after the backward pass
            hook.after_step()
        hook.after_train()           # also when training raised

    A hook with state returns it from :meth:`state_dict` and takes it back in
    :meth:`load_state_dict`; checkpoints keep it under the class's qualified name.

    Example:
        >>> class LogGradNorm(HookBase):
        ...     def after_backward(self):
        ...         norm = torch.norm(torch.stack([p.grad.norm() for p in self.trainer.model.parameters()]))
        ...         get_event_storage().put_scalar("grad_norm", norm)
    """

    _trainer: Any = None

    @property
    def trainer(self) -> TrainerBase:
        """The trainer the hook is registered with (a weak proxy, set by ``register_hooks``)."""
        if self._trainer is None:
            raise HookError(f"{type(self).__name__} is not registered: pass it to trainer.register_hooks([...])")
        trainer: TrainerBase = self._trainer
        return trainer

    @trainer.setter
    def trainer(self, trainer: TrainerBase) -> None:
        self._trainer = trainer

    def before_train(self) -> None:
        """Called once before the first iteration."""

    def after_train(self) -> None:
        """Called once after the last iteration, also when training raised."""

    def before_step(self) -> None:
        """Called before each iteration (keep it quick: timers measure from here)."""

    def after_backward(self) -> None:
        """Called after each iteration's backward pass, before the optimizer step."""

    def after_step(self) -> None:
        """Called after each iteration."""

    def state_dict(self) -> dict[str, Any]:
        """This hook's state for checkpoints; stateless: ``{}``."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if state:
            raise HookError(f"{type(self).__name__} keeps no state but a checkpoint holds {sorted(state)} for it")

    def ember_hooks(self) -> list[BaseHook]:
        """ember hooks that do this hook's work on ember's Trainer (none: its methods do it)."""
        return []


class TrainerBase:
    """A trainer that runs iterations with hooks; subclass it and implement :meth:`run_step`.

    ``train`` runs detectron2's loop::

        before_train()
        for iter in range(start_iter, max_iter):
            before_step(); run_step(); after_step()
        after_train()                      # in finally

    because a ``run_step`` of the user's own owns the whole step (its data, its backward, its
    optimizer step), which ember's loop could neither count nor run.
    :class:`~ember.compat.detectron2.engine.simple.SimpleTrainer` trains on ember's Trainer.

    Attributes:
        iter: the current iteration.
        start_iter: the iteration ``train`` started at.
        max_iter: the iteration ``train`` ends at.
        storage: the :class:`EventStorage` of the current (or last) ``train`` call.

    Example:
        >>> class MyTrainer(TrainerBase):
        ...     def run_step(self):
        ...         loss = self.model(next(self.data)).mean()
        ...         self.optimizer.zero_grad(); loss.backward(); self.optimizer.step()
        >>> trainer = MyTrainer(); trainer.register_hooks([hooks.IterationTimer(), None])
        >>> trainer.train(0, 1000)
    """

    def __init__(self) -> None:
        self._hooks: list[HookBase | BaseHook] = []
        self.iter: int = 0
        self.start_iter: int = 0
        self.max_iter: int = 0
        self.storage: EventStorage = EventStorage(0)

    @property
    def registered_hooks(self) -> tuple[HookBase | BaseHook, ...]:
        """The hooks :meth:`register_hooks` registered, in registration order (detectron2's ``_hooks``)."""
        return tuple(self._hooks)

    def register_hooks(self, hooks: Sequence[HookBase | BaseHook | None]) -> None:
        """Add hooks after those registered before; None entries are skipped.

        detectron2 hooks run in this order. ember hooks (``ember.trainer.hooks``) may be mixed
        in when the trainer runs on ember's Trainer (a ``SimpleTrainer``); they keep their
        priorities.

        Raises:
            HookError: an entry that is not a hook, a misspelt hook method, or an ember hook on
                a trainer whose own ``run_step`` runs detectron2's loop.
        """
        if isinstance(hooks, (HookBase, BaseHook)) or not isinstance(hooks, Sequence):
            raise HookError(f"register_hooks takes a list of hooks, got {type(hooks).__name__}")
        kept = [h for h in hooks if h is not None]
        for hook in kept:
            if isinstance(hook, HookBase):
                _check_methods(hook)
                needs_ember = bool(hook.ember_hooks())
            elif isinstance(hook, BaseHook):
                needs_ember = True
            else:
                raise HookError(
                    f"register_hooks got a {type(hook).__name__}: hooks subclass HookBase "
                    "(or ember.trainer.hooks.BaseHook on a SimpleTrainer)"
                )
            if needs_ember and not self._runs_on_ember():
                raise HookError(
                    f"{type(hook).__name__} needs ember's Trainer, but {type(self).__name__} runs its own run_step "
                    "in detectron2's loop: use it with a SimpleTrainer whose run_step is SimpleTrainer's"
                )
        for hook in kept:
            if isinstance(hook, HookBase):
                hook.trainer = weakref.proxy(self)
        self._hooks.extend(kept)

    def train(self, start_iter: int, max_iter: int) -> None:
        """Run iterations ``start_iter`` to ``max_iter - 1``, calling the hooks around each.

        Raises:
            TrainerError: bad iteration numbers.
        """
        check_range(start_iter, max_iter)
        get_dist_logger().info(f"Starting training from iteration {start_iter}", ranks=[0])
        self.iter = self.start_iter = start_iter
        self.max_iter = max_iter
        with EventStorage(start_iter) as self.storage:
            try:
                self.before_train()
                for self.iter in range(start_iter, max_iter):
                    self.before_step()
                    self.run_step()
                    self.after_step()
                self.iter = max_iter  # only after success: after_train can tell a run that failed
            finally:
                self.after_train()

    def run_step(self) -> None:
        """One iteration; subclasses implement it."""
        raise NotImplementedError(f"{type(self).__name__}.run_step: implement one training iteration")

    # -- the events: detectron2's hooks, in registration order ---------------------------------
    def before_train(self) -> None:
        """Call every hook's ``before_train``."""
        for hook in self._d2_hooks():
            hook.before_train()

    def after_train(self) -> None:
        """Call every hook's ``after_train`` (``storage.iter`` is ``iter`` there)."""
        self.storage.iter = self.iter
        for hook in self._d2_hooks():
            hook.after_train()

    def before_step(self) -> None:
        """Keep ``storage.iter == iter`` for the whole step, then call every hook's ``before_step``."""
        self.storage.iter = self.iter
        for hook in self._d2_hooks():
            hook.before_step()

    def after_backward(self) -> None:
        """Call every hook's ``after_backward``."""
        for hook in self._d2_hooks():
            hook.after_backward()

    def after_step(self) -> None:
        """Call every hook's ``after_step``."""
        for hook in self._d2_hooks():
            hook.after_step()

    # -- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"iteration": iter, "hooks": {hook name: state}}`` (hooks with state only)."""
        states = self.hook_states()
        return {"iteration": self.iter, **({"hooks": states} if states else {})}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output: the iteration and the hooks' states."""
        self.iter = int(state["iteration"])
        self.load_hook_states(state.get("hooks", {}))

    def hook_states(self) -> dict[str, dict[str, Any]]:
        """``{name: state}`` of the detectron2 hooks that keep state, by class qualified name
        (``#2``, ``#3``... for more of one class)."""
        return {name: s for name, hook in self._named_hooks() if (s := hook.state_dict())}

    def load_hook_states(self, states: Mapping[str, Mapping[str, Any]]) -> None:
        """Give each detectron2 hook its state from :meth:`hook_states`.

        Raises:
            HookError: a state for a hook that is not registered.
        """
        named = dict(self._named_hooks())
        unknown = sorted(set(states) - set(named))
        if unknown:
            raise HookError(f"saved state for hooks {unknown}, which are not registered (registered: {sorted(named)})")
        for name, state in states.items():
            named[name].load_state_dict(state)

    def _named_hooks(self) -> Iterator[tuple[str, HookBase]]:
        seen: dict[str, int] = {}
        for hook in self._d2_hooks():
            base = type(hook).__qualname__
            seen[base] = seen.get(base, 0) + 1
            yield (base if seen[base] == 1 else f"{base}#{seen[base]}"), hook

    def _d2_hooks(self) -> list[HookBase]:
        return [h for h in self._hooks if isinstance(h, HookBase)]

    def _runs_on_ember(self) -> bool:
        """Whether ``train`` runs on ember's Trainer (a SimpleTrainer whose run_step is SimpleTrainer's)."""
        return False


def check_range(start_iter: Any, max_iter: Any) -> None:
    """``train(start_iter, max_iter)``'s numbers: ints, ``0 <= start_iter <= max_iter``, ``max_iter >= 1``."""
    for name, value in (("start_iter", start_iter), ("max_iter", max_iter)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TrainerError(f"train({name}=...) must be an int, got {value!r}")
    if not 0 <= start_iter <= max_iter or max_iter < 1:
        raise TrainerError(
            f"train(start_iter={start_iter}, max_iter={max_iter}): need 0 <= start_iter <= max_iter and max_iter >= 1"
        )


def _check_methods(hook: HookBase) -> None:
    """A public method named like a hook event but not one of detectron2's would never be called."""
    cls = type(hook)
    for name in dir(cls):
        if name in EVENTS or not name.startswith(("before_", "after_", "on_")) or not callable(getattr(cls, name)):
            continue
        close = _EMBER_NAMES.get(name) or next(iter(difflib.get_close_matches(name, EVENTS, n=1, cutoff=0.6)), "")
        hint = f"did you mean {close!r}? " if close else ""
        raise HookError(
            f"{cls.__name__}.{name} is not a detectron2 hook method and would never be called: {hint}"
            f"they are {', '.join(EVENTS)} (prefix helpers with '_')"
        )
