"""detectron2's ``checkpoint`` (fvcore's ``Checkpointer``, LiBai's ``utils.checkpoint``), on ember's checkpoints.

A checkpoint is ember's: the whole training state of a :class:`SimpleTrainer` (the model, the
optimizer, ember's counters, the detectron2 hooks' states such as the LR scheduler's, the random
generators, the data loader's position), written atomically by rank 0 (see
``docs/checkpoint.md``). So the checkpointer needs the trainer, as detectron2's
``DetectionCheckpointer(model, save_dir, trainer=trainer)`` has it; without one it only loads
model weights (for evaluation).

Example:
    >>> checkpointer = DetectionCheckpointer(model, "output", trainer=trainer)
    >>> trainer.register_hooks([hooks.PeriodicCheckpointer(checkpointer, period=500)])
    >>> checkpointer.resume_or_load("", resume=True)   # the newest checkpoint in output/, if any
    >>> trainer.train(trainer.iter + 1 if checkpointer.has_checkpoint() else 0, 10_000)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ember import checkpoint
from ember.errors import CheckpointError

if TYPE_CHECKING:
    from torch import nn

    from ember.compat.detectron2.engine.simple import SimpleTrainer

__all__ = ["Checkpointer", "DetectionCheckpointer"]


class Checkpointer:
    """Save and load a SimpleTrainer's state as ember checkpoints, with fvcore's methods.

    Args:
        model: the trainer's model (without a trainer: the model to load weights into).
        save_dir: the checkpoint directory.
        save_to_disk: accepted for fvcore's signature; ember's rank 0 writes, and every rank
            must call ``save`` (it is a collective). False on rank 0 is refused.
        **checkpointables: only ``trainer=`` (the SimpleTrainer, or a weak proxy of it): its
            optimizer and its hooks' states are part of every checkpoint already.

    Raises:
        CheckpointError: another checkpointable, a trainer that is not a SimpleTrainer, or a
            model that is not the trainer's.
    """

    def __init__(
        self, model: nn.Module, save_dir: str | os.PathLike[str] = "", *, save_to_disk: bool = True,
        **checkpointables: Any,
    ) -> None:  # fmt: skip
        trainer = checkpointables.pop("trainer", None)
        if checkpointables:
            raise CheckpointError(
                f"Checkpointer got {sorted(checkpointables)}: ember's checkpoints hold a trainer's whole state (its "
                "optimizer, and LR schedulers through the LRScheduler hook): pass trainer=trainer only"
            )
        if trainer is not None and getattr(trainer, "ember_trainer", None) is None:
            raise CheckpointError(
                "Checkpointer(trainer=...) needs a SimpleTrainer (it runs on ember's Trainer), got "
                f"{type(trainer).__name__}"
            )
        if trainer is not None and trainer.model is not model:
            raise CheckpointError("Checkpointer(model, trainer=trainer): model must be trainer.model")
        from ember import distributed

        if not save_to_disk and distributed.rank() == 0:
            raise CheckpointError("Checkpointer(save_to_disk=False) on rank 0: ember's rank 0 writes every checkpoint")
        self.model, self.save_dir, self.save_to_disk = model, str(save_dir), save_to_disk
        self.trainer: SimpleTrainer | None = trainer

    def save(self, name: str, **kwargs: Any) -> None:
        """Save the trainer's state to ``save_dir/<name>.ckpt`` now; a collective (every rank calls it).

        ``iteration=`` is accepted and is the trainer's anyway; other keywords are refused
        (ember's checkpoint has a fixed content).
        """
        unknown = sorted(set(kwargs) - {"iteration"})
        if unknown:
            raise CheckpointError(
                f"Checkpointer.save got {unknown}: an ember checkpoint holds the trainer's state only"
            )
        checkpoint.save(Path(self.save_dir) / f"{name}{checkpoint.SUFFIX}", self._trainer("save").ember_trainer)

    def load(self, path: str | os.PathLike[str], checkpointables: list[str] | None = None) -> dict[str, Any]:
        """Load ``path``: with a trainer, its whole state (``trainer.iter`` = the saved iteration),
        else (or with ``checkpointables=[]``) the model weights only.

        Returns:
            ``{"iteration": saved iteration, ...the checkpoint's metadata}``; ``{}`` for weights
            only or an empty ``path``.
        """
        if not str(path):
            return {}
        if self.trainer is None or checkpointables == []:
            self.model.load_state_dict(checkpoint.model_state(path))
            return {}
        if checkpointables is not None:
            raise CheckpointError(
                f"Checkpointer.load(checkpointables={checkpointables!r}): ember loads a trainer's state whole "
                "(None) or the model weights alone ([])"
            )
        meta = checkpoint.load(path, self.trainer.ember_trainer)
        self.trainer.iter = int(meta["step"]) - 1  # the iteration it was saved after
        return {**meta, "iteration": self.trainer.iter}

    def resume_or_load(self, path: str | os.PathLike[str], *, resume: bool = True) -> dict[str, Any]:
        """With ``resume`` and a checkpoint in ``save_dir``: load the newest whole; otherwise load
        the model weights of ``path`` (if given)."""
        if resume and self.has_checkpoint():
            return self.load(self.get_checkpoint_file())
        return self.load(path, checkpointables=[])

    def has_checkpoint(self) -> bool:
        """Whether ``save_dir`` holds a checkpoint."""
        return checkpoint.latest(self.save_dir) is not None if self.save_dir else False

    def get_checkpoint_file(self) -> str:
        """The newest checkpoint in ``save_dir`` ('' if none)."""
        newest = checkpoint.latest(self.save_dir) if self.save_dir else None
        return "" if newest is None else str(newest)

    def get_all_checkpoint_files(self) -> list[str]:
        """Every checkpoint in ``save_dir``, oldest first."""
        return [str(found.path) for found in checkpoint.find_checkpoints(self.save_dir)] if self.save_dir else []

    def _trainer(self, what: str) -> SimpleTrainer:
        if self.trainer is None:
            raise CheckpointError(f"Checkpointer.{what} needs the trainer: build it with trainer=trainer")
        return self.trainer


DetectionCheckpointer = Checkpointer
"""detectron2's name (its conversions of model-zoo ``.pkl`` files are not provided)."""
