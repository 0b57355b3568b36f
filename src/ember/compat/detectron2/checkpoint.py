"""detectron2's ``checkpoint`` (fvcore's ``Checkpointer``, ``PeriodicCheckpointer``; LiBai's
``utils.checkpoint``), on ember's checkpoints.

``Checkpointer(model, save_dir, **checkpointables)`` saves and loads any objects with
``state_dict``/``load_state_dict`` (``optimizer=``, ``scheduler=``, your own), as fvcore's does:
``save(name)`` writes ``save_dir/<name>.pth`` and points ``save_dir/last_checkpoint`` at it, and
``torch.load(path)`` reads fvcore's layout (``"model"``, each checkpointable under its name,
the ``save`` keywords such as ``iteration``).

With ``trainer=`` a :class:`SimpleTrainer` the file is ember's checkpoint of the whole training
state (model, optimizer, the hooks' states such as the LR scheduler's, the random generators,
the data loader's position) with that layout on top, so a resumed run continues exactly;
``resume_or_load`` restores the trainer, its hooks and every checkpointable at once. Without a
trainer the file holds the model and the checkpointables only, written by ember's atomic
writer and read with torch's safe loader (a file written by fvcore or detectron2 loads too).

Example:
    >>> checkpointer = DetectionCheckpointer(model, "output", trainer=trainer)
    >>> trainer.register_hooks([hooks.PeriodicCheckpointer(checkpointer, period=500)])
    >>> checkpointer.resume_or_load("", resume=True)   # the newest checkpoint in output/, if any
    >>> trainer.train(trainer.iter + 1 if checkpointer.has_checkpoint() else 0, 10_000)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ember import checkpoint, distributed
from ember.checkpoint.io import write_pointer
from ember.compat._not_provided import module_getattr
from ember.compat._views import CHECKPOINT_SECTIONS, save_with_view
from ember.errors import CheckpointError, describe
from ember.logging import get_dist_logger
from ember.trainer.hooks import BaseHook, Priority

if TYPE_CHECKING:
    from torch import nn

    from ember.compat.detectron2.engine.simple import SimpleTrainer

__all__ = ["Checkpointer", "DetectionCheckpointer", "PeriodicCheckpointer"]

HOOK_NAME = "detectron2.checkpointables"
"""The ember hook that carries a Checkpointer's objects in every checkpoint of its trainer."""


class CheckpointablesHook(BaseHook):
    """Keeps a Checkpointer's objects (other than the trainer's own) in the trainer's ember
    checkpoints, those of ``PeriodicCheckpointer`` included; their states load back with it."""

    def __init__(self, objects: Mapping[str, Any]) -> None:
        super().__init__(Priority.LOWEST, name=HOOK_NAME)
        self.objects = dict(objects)

    def state_dict(self) -> dict[str, Any]:
        """Each object's ``state_dict()``, by its name."""
        return {name: obj.state_dict() for name, obj in self.objects.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load each object's state (names the checkpoint does not have are left as they are)."""
        for name, obj in self.objects.items():
            if name in state:
                obj.load_state_dict(state[name])


class Checkpointer:
    """Save and load a model and other objects with fvcore's methods, in ember's checkpoints.

    Args:
        model: the model (with a trainer: the trainer's model).
        save_dir: the checkpoint folder ('': no saving; loading by path still works).
        save_to_disk: without a trainer, whether this process writes (detectron2 passes
            ``comm.is_main_process()``); with a trainer, ember's rank 0 writes and every rank
            must call ``save`` (a collective), so False on rank 0 is refused.
        **checkpointables: objects with ``state_dict()``/``load_state_dict()``, by name, and
            ``trainer=`` a SimpleTrainer (its whole state).

    Raises:
        CheckpointError: a checkpointable without ``state_dict``/``load_state_dict``, a name
            ember's checkpoint uses itself, or a model that is not the trainer's.
    """

    def __init__(
        self, model: nn.Module, save_dir: str | os.PathLike[str] = "", *, save_to_disk: bool = True,
        **checkpointables: Any,
    ) -> None:  # fmt: skip
        trainer = checkpointables.pop("trainer", None)
        if trainer is not None and getattr(trainer, "ember_trainer", None) is None:
            raise CheckpointError(
                f"Checkpointer(trainer=...) needs a SimpleTrainer (it runs on ember's Trainer), got {describe(trainer)}"
            )
        if trainer is not None and trainer.model is not model:
            raise CheckpointError("Checkpointer(model, trainer=trainer): model must be trainer.model")
        for name, obj in checkpointables.items():
            if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
                raise CheckpointError(
                    f"Checkpointer({name}=...) needs an object with state_dict() and load_state_dict(), "
                    f"got {describe(obj)}"
                )
        taken = sorted((set(checkpointables) & CHECKPOINT_SECTIONS) | ({"model"} & set(checkpointables)))
        if taken:
            raise CheckpointError(f"Checkpointer: the names {taken} are the checkpoint's own; name the objects else")
        if trainer is not None and not save_to_disk and distributed.rank() == 0:
            raise CheckpointError("Checkpointer(save_to_disk=False) on rank 0: ember's rank 0 writes every checkpoint")
        self.model, self.save_dir, self.save_to_disk = model, str(save_dir), save_to_disk
        self.checkpointables: dict[str, Any] = dict(checkpointables)
        self.trainer: SimpleTrainer | None = trainer
        self.logger = get_dist_logger()
        self._hook: CheckpointablesHook | None = None
        if trainer is not None and checkpointables:
            self._hook = CheckpointablesHook(checkpointables)
            trainer.register_hooks([self._hook])

    # -- saving -------------------------------------------------------------------------------
    def save(self, name: str, **kwargs: Any) -> None:
        """Write ``save_dir/<name>.pth`` and point ``last_checkpoint`` at it.

        With a trainer it is a collective (call it on every rank). ``kwargs`` (numbers, strings,
        tensors...) go at the top level, as fvcore's; ``iteration`` defaults to the trainer's.
        """
        if not self.save_dir:
            return
        path = Path(self.save_dir) / f"{name}.pth"
        objects = self.checkpointables
        if self.trainer is not None:
            kwargs.setdefault("iteration", self.trainer.iter)
            taken = sorted(set(kwargs) & (CHECKPOINT_SECTIONS | {"model"} | set(objects)))
            if taken:
                raise CheckpointError(f"Checkpointer.save: {taken} are the checkpoint's own entries; rename them")

            def view(state: dict[str, Any]) -> dict[str, Any]:
                return {"model": state["engine"]["model"], **{n: o.state_dict() for n, o in objects.items()}, **kwargs}

            save_with_view(path, self.trainer.ember_trainer, view)
            if distributed.rank() == 0:
                write_pointer(self.save_dir, path.name)
            return
        if not self.save_to_disk:
            return
        data = {"model": self.model.state_dict(), **{n: o.state_dict() for n, o in objects.items()}, **kwargs}
        try:
            checkpoint.save_file(data, path)
        except OSError as exc:
            raise checkpoint.write_error(path, exc) from None
        write_pointer(self.save_dir, path.name)

    # -- loading ------------------------------------------------------------------------------
    def load(self, path: str | os.PathLike[str], checkpointables: list[str] | None = None) -> dict[str, Any]:
        """Load ``path``: the model, and the checkpointables named (None: all that the file has).

        An ember checkpoint with a trainer restores the trainer's whole state and its hooks'
        (``trainer.iter`` = the iteration saved); with ``checkpointables=[]`` only the weights load.

        Returns:
            What the file holds besides the model and the objects loaded (``iteration``...).
        """
        if not str(path):
            self.logger.info("No checkpoint found. Initializing model from scratch", ranks=[0])
            return {}
        raw = checkpoint.load_file(path, mmap=True)
        if not isinstance(raw, Mapping):
            raise CheckpointError(f"{str(path)!r} is not a checkpoint (a dict), got {describe(raw)}")
        names = list(self.checkpointables) if checkpointables is None else list(checkpointables)
        unknown = sorted(set(names) - set(self.checkpointables))
        if unknown:
            raise CheckpointError(f"Checkpointer.load(checkpointables={unknown}): not given to this Checkpointer")
        if "format" in raw:
            return self._load_ember(path, names, whole=checkpointables is None)
        model_state = raw.get("model")
        if not isinstance(model_state, Mapping):
            raise CheckpointError(
                f"{str(path)!r} has no 'model' state dict (fvcore's layout) and is no ember checkpoint"
            )
        self.model.load_state_dict(dict(model_state))
        for name in names:
            if name in raw:
                self.checkpointables[name].load_state_dict(raw[name])
            else:
                self.logger.warning(f"checkpoint {str(path)!r} has no state for {name!r}", ranks=[0])
        return {k: v for k, v in raw.items() if k != "model" and k not in names}

    def _load_ember(self, path: str | os.PathLike[str], names: list[str], whole: bool) -> dict[str, Any]:
        saved = checkpoint.read(path, mmap=True)
        carried = saved["hooks"].get(HOOK_NAME, {})
        states = {n: saved[n] if n in saved else carried.get(n) for n in names}
        if self.trainer is not None and whole:
            meta = checkpoint.load(path, self.trainer.ember_trainer)
            self.trainer.iter = int(meta["step"]) - 1  # the iteration it was saved after
            bridge = saved["hooks"].get("detectron2", {})
            self.trainer.load_hook_states(bridge.get("hooks", {}))  # now, not when train starts
        else:
            self.model.load_state_dict(checkpoint.model_state(path))
        for name, state in states.items():
            if state is not None:
                self.checkpointables[name].load_state_dict(state)
        rest = {k: v for k, v in saved.items() if k not in CHECKPOINT_SECTIONS and k != "model" and k not in names}
        if self.trainer is not None and whole:
            rest["iteration"] = self.trainer.iter
        return rest

    def resume_or_load(self, path: str | os.PathLike[str], *, resume: bool = True) -> dict[str, Any]:
        """With ``resume`` and a checkpoint in ``save_dir``: load the newest, whole; otherwise load
        ``path``'s model weights only (if given), as fvcore does."""
        if resume and self.has_checkpoint():
            return self.load(self.get_checkpoint_file())
        return self.load(path, checkpointables=[])

    def has_checkpoint(self) -> bool:
        """Whether ``save_dir`` holds a checkpoint (its ``last_checkpoint`` pointer, or ember's files)."""
        return bool(self.get_checkpoint_file())

    def get_checkpoint_file(self) -> str:
        """The checkpoint ``last_checkpoint`` names, else the newest ember checkpoint ('' if none)."""
        if not self.save_dir:
            return ""
        named = checkpoint.read_pointer(self.save_dir)
        if named is not None and (Path(self.save_dir) / named).exists():
            return str(Path(self.save_dir) / named)
        newest = checkpoint.latest(self.save_dir)
        return "" if newest is None else str(newest)

    def get_all_checkpoint_files(self) -> list[str]:
        """Every checkpoint in ``save_dir``: ``.pth`` files, then ember's by step."""
        if not self.save_dir or not Path(self.save_dir).is_dir():
            return []
        pth = sorted(str(p) for p in Path(self.save_dir).glob("*.pth") if p.is_file())
        return pth + [str(found.path) for found in checkpoint.find_checkpoints(self.save_dir)]


DetectionCheckpointer = Checkpointer
"""detectron2's name (its conversions of model-zoo ``.pkl`` files are not provided)."""


class PeriodicCheckpointer:
    """fvcore's ``PeriodicCheckpointer`` for a loop of your own: ``step(iteration)`` saves every
    ``period`` iterations (``model_{iteration:07d}``) and at ``max_iter - 1`` (``model_final``),
    keeping the newest ``max_to_keep`` periodic files.

    (For a SimpleTrainer use ``engine.hooks.PeriodicCheckpointer``: it saves after every hook of
    the step.)

    Args:
        checkpointer: the :class:`Checkpointer`.
        period: iterations between saves.
        max_iter: the last iteration + 1 (a final save at ``max_iter - 1``), or None.
        max_to_keep: how many periodic checkpoints to keep (None: all).
        file_prefix: the files' name before the iteration.
    """

    def __init__(self, checkpointer: Checkpointer, period: int, max_iter: int | None = None,
                 max_to_keep: int | None = None, file_prefix: str = "model") -> None:  # fmt: skip
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise CheckpointError(f"PeriodicCheckpointer(period=...) must be an int >= 1, got {describe(period)}")
        self.checkpointer, self.period, self.max_iter = checkpointer, period, max_iter
        self.max_to_keep, self.file_prefix = max_to_keep, file_prefix
        self.recent_checkpoints: list[str] = []

    def step(self, iteration: int, **kwargs: Any) -> None:
        """Save if ``iteration`` ends a period (or is the last); ``kwargs`` go into the file."""
        iteration = int(iteration)
        extra = {"iteration": iteration, **kwargs}
        if (iteration + 1) % self.period == 0:
            name = f"{self.file_prefix}_{iteration:07d}"
            self.checkpointer.save(name, **extra)
            self.recent_checkpoints.append(str(Path(self.checkpointer.save_dir) / f"{name}.pth"))
            while self.max_to_keep is not None and len(self.recent_checkpoints) > self.max_to_keep:
                old = Path(self.recent_checkpoints.pop(0))
                if distributed.rank() == 0 and old.is_file() and not old.name.endswith("_final.pth"):
                    old.unlink()
        if self.max_iter is not None and iteration >= self.max_iter - 1:
            self.checkpointer.save(f"{self.file_prefix}_final", **extra)

    def save(self, name: str, **kwargs: Any) -> None:
        """Save now under ``name``."""
        self.checkpointer.save(name, **kwargs)


__getattr__ = module_getattr(__name__, "detectron2.checkpoint", {
    "DetectionCheckpointer.load_c2": "model-zoo .pkl conversions are not provided",
    "c2_model_loading": "model-zoo .pkl conversions are not provided: load a state dict",
    "catalog": "the model zoo's URLs are not provided: download the weights and load them with load()",
})  # fmt: skip
