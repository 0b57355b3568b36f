"""The pytorch-accelerated Trainer's checkpoint methods, over ember's one checkpoint format.

``save_checkpoint`` writes an ember checkpoint (it resumes exactly) whose top level also holds
pytorch-accelerated's keys (``model_state_dict``, ``optimizer_state_dict``,
``scheduler_state_dict`` and the user's ``checkpoint_kwargs``), sharing the tensors, so a
plain ``torch.load(path)["model_state_dict"]`` reads it as pytorch-accelerated's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ember import checkpoint
from ember.checkpoint.sharded import is_checkpoint_dir, is_sharded
from ember.compat._views import CHECKPOINT_SECTIONS, save_with_view
from ember.errors import CheckpointError, TrainerError, describe

from .tracking import set_epoch

__all__ = ["PTA_VIEW", "CheckpointMethods"]

PTA_VIEW = ("model_state_dict", "optimizer_state_dict", "scheduler_state_dict")
"""The keys a pytorch-accelerated user reads from ``torch.load(path)`` of a checkpoint."""

_RESERVED = CHECKPOINT_SECTIONS | set(PTA_VIEW)
"""Top-level checkpoint keys that ``checkpoint_kwargs`` may not use."""


class CheckpointMethods:
    """``save_checkpoint``/``load_checkpoint`` and ``save_training_state``/``load_training_state``
    (mixed into the compat Trainer, which provides ``engine``, ``scheduler`` and ``run_history``)."""

    engine: Any
    scheduler: Any
    run_history: Any
    cur_epoch: int
    cur_step: int

    def _state(self) -> checkpoint.TrainingState:
        """This trainer, as what ember's checkpoint functions save and load."""
        state: Any = self  # the compat Trainer is an ember Trainer, a TrainingState
        return state

    def save_checkpoint(
        self, save_path: str | os.PathLike[str], checkpoint_kwargs: Mapping[str, Any] | None = None,
        save_optimizer: bool = True, save_scheduler: bool = True, save_per_node: bool = True,
    ) -> None:  # fmt: skip
        """Save the training state as an ember checkpoint that ``torch.load`` reads as
        pytorch-accelerated's; a collective (call it on every process).

        One file, ember's format (it resumes exactly: ``train(resume_from=path)``), with
        pytorch-accelerated's keys on top: ``model_state_dict``, ``optimizer_state_dict`` (with
        ``save_optimizer``), ``scheduler_state_dict`` (with ``save_scheduler`` and a scheduler),
        and each of ``checkpoint_kwargs`` at the top level. The model and optimizer tensors are
        stored once (the keys share them). Under FSDP2/tensor parallelism it is ember's sharded
        checkpoint directory instead (read it with ``ember.checkpoint.model_state``).

        Args:
            save_path: the file to write (its parent is created).
            checkpoint_kwargs: your own entries (numbers, strings, tensors and containers of
                them), returned by :meth:`load_checkpoint`.
            save_optimizer: include the optimizer's state (without it the file is smaller and a
                resume starts the optimizer afresh).
            save_scheduler: include the scheduler's state.
            save_per_node: kept for the signature: the first process writes, once.

        Raises:
            TrainerError: a ``checkpoint_kwargs`` key that the checkpoint itself uses.
        """
        extra = self._checkpoint_kwargs(checkpoint_kwargs)
        if is_sharded(self.engine):
            checkpoint.save(save_path, self._state(), extra=extra)
            return
        scheduler = self.scheduler if save_scheduler else None

        def view(state: dict[str, Any]) -> dict[str, Any]:
            engine = state["engine"]
            top = {"model_state_dict": engine["model"]}
            if save_optimizer:
                top["optimizer_state_dict"] = engine["optimizer"]
            else:
                engine["optimizer"] = {}
            if scheduler is not None:
                top["scheduler_state_dict"] = scheduler.state_dict()
            return {**top, **extra}

        save_with_view(save_path, self._state(), view, extra=extra)

    @staticmethod
    def _checkpoint_kwargs(kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
        if kwargs is None:
            return {}
        if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
            raise TrainerError(f"checkpoint_kwargs must be a dict with string keys, got {describe(kwargs)}")
        taken = sorted(set(kwargs) & _RESERVED)
        if taken:
            raise TrainerError(
                f"checkpoint_kwargs uses {taken}, which the checkpoint itself holds: rename them "
                f"(reserved: {', '.join(sorted(_RESERVED))})"
            )
        # NumPy scalars become Python numbers: the file must load with torch's safe loader.
        return {k: v.item() if hasattr(v, "item") and getattr(v, "ndim", None) == 0 and not isinstance(v, torch.Tensor)
                else v for k, v in kwargs.items()}  # fmt: skip

    def load_checkpoint(
        self, checkpoint_path: str | os.PathLike[str], load_optimizer: bool = True, load_scheduler: bool = True
    ) -> dict[str, Any]:
        """Load the model's weights, and the optimizer's and scheduler's states, from a checkpoint; a collective.

        Reads what :meth:`save_checkpoint` writes, an ember checkpoint, or a file written by
        pytorch-accelerated itself (``model_state_dict``...), always with torch's safe loader.

        Args:
            checkpoint_path: the checkpoint.
            load_optimizer: load the optimizer's state when the checkpoint has one.
            load_scheduler: load the scheduler's state when the checkpoint has one (the Trainer
                must have a scheduler then: ``trainer.scheduler``).

        Returns:
            The checkpoint as ``torch.load`` reads it: ``model_state_dict``, the saved
            ``checkpoint_kwargs`` at the top level, ...

        Raises:
            CheckpointError: a missing or damaged file, or a sharded checkpoint directory with
                ``load_optimizer=True`` (its optimizer state is sharded: resume it with
                ``train(resume_from=path)``).
            TrainerError: the checkpoint has a scheduler state and the Trainer has no scheduler.
        """
        path = Path(checkpoint_path)
        if is_checkpoint_dir(path):
            if load_optimizer:
                raise CheckpointError(
                    f"{str(path)!r} is a sharded checkpoint directory, whose optimizer state is in shards: continue "
                    "the run from it with trainer.train(..., resume_from=path), or load the weights alone with "
                    "load_checkpoint(path, load_optimizer=False)"
                )
            saved = checkpoint.read(path)
            saved["model_state_dict"] = checkpoint.model_state(path)
        else:
            saved = self._read_file(path)
        state = self.engine.state_dict()  # the counters and scaler stay as they are now
        state["model"] = saved["model_state_dict"]
        if load_optimizer and saved.get("optimizer_state_dict"):
            state["optimizer"] = saved["optimizer_state_dict"]
        self.engine.load_state_dict(state)
        if load_scheduler and "scheduler_state_dict" in saved:
            if self.scheduler is None:
                raise TrainerError(
                    f"checkpoint {str(path)!r} holds a scheduler state but trainer.scheduler is None: set the "
                    "scheduler first, or pass load_scheduler=False"
                )
            self.scheduler.load_state_dict(saved["scheduler_state_dict"])
        return saved

    @staticmethod
    def _read_file(path: Path) -> dict[str, Any]:
        """A checkpoint file with pytorch-accelerated's keys: ember's (checked) or pytorch-accelerated's own."""
        raw = checkpoint.load_file(path)
        if isinstance(raw, Mapping) and "format" in raw:
            saved = checkpoint.read(path)
            engine = saved["engine"]
            saved.setdefault("model_state_dict", engine["model"])
            if engine.get("optimizer"):
                saved.setdefault("optimizer_state_dict", engine["optimizer"])
            return saved
        if not isinstance(raw, Mapping) or not isinstance(raw.get("model_state_dict"), Mapping):
            raise CheckpointError(
                f"{str(path)!r} is neither an ember checkpoint nor a pytorch-accelerated one (a dict with "
                "'model_state_dict'); for bare weights use trainer.get_model().load_state_dict(torch.load(path))"
            )
        return dict(raw)

    def save_training_state(
        self, output_dir: str | os.PathLike[str], checkpoint_kwargs: Mapping[str, Any] | None = None
    ) -> None:
        """Save everything an exact resume needs into the folder ``output_dir``; a collective.

        The folder holds one ember checkpoint (model, optimizer, scheduler and callback states,
        scaler, random generators, the data position); ``train(..., resume_from=output_dir)``
        continues from it, and :meth:`load_training_state` loads it.

        Args:
            output_dir: the folder (created).
            checkpoint_kwargs: your own entries, returned by :meth:`load_training_state` with
                ``current_epoch``.
        """
        extra = {"current_epoch": self.run_history.current_epoch, **self._checkpoint_kwargs(checkpoint_kwargs)}
        name = checkpoint.checkpoint_name(self.cur_epoch, self.cur_step)
        checkpoint.save(Path(output_dir) / name, self._state(), extra=extra)

    def load_training_state(self, input_dir: str | os.PathLike[str]) -> dict[str, Any]:
        """Load the state :meth:`save_training_state` wrote (the newest checkpoint in the folder);
        the next ``train`` continues it. A collective.

        Returns:
            ``current_epoch`` and the saved ``checkpoint_kwargs``.
        """
        meta = checkpoint.load(input_dir, self._state())
        saved = dict(meta.get("extra", {}))
        if "current_epoch" in saved:
            set_epoch(self.run_history, int(saved["current_epoch"]))
        return saved
