"""How a SimpleTrainer runs on ember's Trainer: three ember hooks and a schedule.

* :class:`Tag` (``Priority.HIGHEST``, registered first): ember's Trainer tags storage values
  with its update count, which reaches ``iter + 1`` when the optimizer steps; for the rest of
  the iteration Tag puts the tag back at ``iter``, so every value of an iteration, from
  detectron2 or ember hooks, carries that iteration's number (as in detectron2).
* :class:`Bridge` (``Priority.NORMAL``) turns ember's events into the trainer's detectron2
  events (``before_train``, ``before_step``, ``after_step``, ``after_train``), which call the
  detectron2 hooks in registration order; its state is theirs.
* :class:`Advance` (``Priority.LOWEST``, registered last) moves ``trainer.iter`` on once every
  hook has finished the step, checkpoints included: a step that raised leaves it where it was.
* :class:`Step` is the ember schedule: one batch through ``SimpleTrainer.forward_backward``.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from ember import distributed
from ember.errors import TrainerError
from ember.trainer import Steps
from ember.trainer.hooks import BaseHook, CheckpointHook, Priority

if TYPE_CHECKING:
    from ember.compat.detectron2.engine.simple import SimpleTrainer


class Tag(BaseHook):
    """First in ``after_train_iter``: storage values put from now on are tagged with ``iter``."""

    def __init__(self, owner: SimpleTrainer) -> None:
        super().__init__(Priority.HIGHEST, name="detectron2.tag")
        self._owner = weakref.proxy(owner)

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Tag with the iteration, not ember's update count."""
        self.trainer.storage.step = self._owner.iter


class Bridge(BaseHook):
    """ember's events -> the SimpleTrainer's detectron2 events (and the hooks' states)."""

    def __init__(self, owner: SimpleTrainer) -> None:
        super().__init__(Priority.NORMAL, name="detectron2")
        self._owner = weakref.proxy(owner)

    def before_train(self) -> None:
        """detectron2's ``before_train``, from the iteration ember resumed at."""
        owner = self._owner
        if owner.iter != self.trainer.cur_step:  # ember's own resume ($EMBER_RESUME) moved the start
            owner.iter = owner.start_iter = self.trainer.cur_step
        owner.storage.iter = owner.iter
        owner.before_train()

    def before_train_iter(self) -> None:
        """detectron2's ``before_step``."""
        self._owner.before_step()

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        """detectron2's ``after_step``."""
        self._owner.after_step()

    def after_train(self) -> None:
        """detectron2's ``after_train``."""
        self._owner.after_train()

    def state_dict(self) -> dict[str, Any]:
        """The detectron2 hooks' states (``{"hooks": {name: state}}``), if any keeps one."""
        states = self._owner.hook_states()
        return {"hooks": states} if states else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Give the detectron2 hooks their states."""
        self._owner.load_hook_states(state.get("hooks", {}))


class Advance(BaseHook):
    """After every other hook of a step: ``trainer.iter`` is the next iteration (ember's step count)."""

    def __init__(self, owner: SimpleTrainer) -> None:
        super().__init__(Priority.LOWEST, name="detectron2.iteration")
        self._owner = weakref.proxy(owner)

    def before_train(self) -> None:
        """The first iteration's data time starts now."""
        self._owner.mark_step_end()

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        """Move to the next iteration (and the storage's tag with it); its data time starts now."""
        owner, trainer = self._owner, self.trainer
        owner.iter = owner.storage.iter = trainer.storage.step = trainer.cur_step
        owner.mark_step_end()


class Step:
    """ember's schedule for a SimpleTrainer: ``forward_backward`` on each batch; ember steps."""

    def __init__(self, owner: SimpleTrainer) -> None:
        self._owner = weakref.proxy(owner)

    def forward_backward(self, steps: Steps, batch: Any, boundary: bool) -> dict[str, Any]:
        """One iteration's forward and backward (see ``SimpleTrainer.forward_backward``)."""
        owner = self._owner
        return owner.forward_backward(batch, owner.since_step_end(), boundary)

    def forward(self, steps: Steps, batch: Any) -> dict[str, Any]:
        """The losses of one batch without backward (``ember_trainer.evaluate``)."""
        loss_dict, total = self._owner.losses(batch)
        return {"loss": total, "output": loss_dict, "label": None, "batch_size": batch_size(batch)}


def batch_size(data: Any) -> int:
    """Samples in a batch: a tensor's first dimension, a list's length (detectron2's lists of dicts)."""
    if isinstance(data, torch.Tensor):
        return int(data.shape[0]) if data.dim() else 1
    if isinstance(data, Mapping):
        return next((batch_size(v) for v in data.values() if isinstance(v, torch.Tensor)), 1)
    if isinstance(data, (list, tuple)) and data:
        return batch_size(data[0]) if isinstance(data[0], torch.Tensor) else len(data)
    return 1


def ember_hooks(owner: SimpleTrainer) -> list[BaseHook]:
    """The ember hooks of ``owner``'s run: :class:`Tag`, :class:`Bridge`, the ember hooks registered
    (and those that detectron2 hooks work through) in registration order, :class:`Advance`."""
    hooks: list[BaseHook] = [Tag(owner), Bridge(owner)]
    periodic: list[CheckpointHook] = []
    for hook in owner.registered_hooks:
        if isinstance(hook, BaseHook):
            hooks.append(hook)
        else:
            contributed = hook.ember_hooks()
            hooks.extend(contributed)
            periodic += [h for h in contributed if isinstance(h, CheckpointHook)]
    hooks += _on_every_rank(periodic)
    hooks.append(Advance(owner))
    return hooks


def _on_every_rank(periodic: list[CheckpointHook]) -> list[CheckpointHook]:
    """The PeriodicCheckpointers' saves that this rank must join, registered elsewhere than here.

    detectron2 and LiBai programs register the PeriodicCheckpointer on the main process only;
    ember's saves are collectives (every rank gives its random state and, under ZeRO/FSDP, its
    shards), so the other ranks join rank 0's with the same CheckpointHook. A collective: two
    exchanges when ``train`` starts, none with one process.
    """
    if not distributed.is_active():
        return []
    mine = [(str(h.dir), h.every_n_steps, h.keep_last) for h in periodic]
    first = distributed.broadcast_object(mine if distributed.rank() == 0 else None)
    if distributed.any_true(bool(mine) and mine != first):
        raise TrainerError(
            f"PeriodicCheckpointer differs between ranks (rank 0: {first}, here: {mine}): register it on rank 0 "
            "only or the same on every rank"
        )
    if mine:
        return []
    name = "PeriodicCheckpointer"
    return [CheckpointHook(d, every_n_steps=n, every_n_epochs=None, keep_last=k, name=name) for d, n, k in first]
