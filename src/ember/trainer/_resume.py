"""``fit(resume=...)``, and how ``fit`` ends after a preemption.

Resuming is the Trainer's (``resume=PATH`` needs no hook); ``resume="auto"`` looks in the
directory of the hook that keeps checkpoints. That hook is recognised by the
:class:`~ember.checkpoint.Checkpointer` it holds, not its class, so the loop imports no concrete
hook; it saves the state ``fit`` ends with in its ``after_train_loop`` event.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ember.checkpoint import Checkpointer, open_checkpoint
from ember.checkpoint.opening import restore_from
from ember.errors import CheckpointError, TrainerError
from ember.trainer._preempt import Preempted

if TYPE_CHECKING:
    from ember.checkpoint.snapshot import TrainingState
    from ember.logging import DistributedLogger

RESUME_ENV = "EMBER_RESUME"
"""When ``fit(resume=None)``, this variable's value is used instead (``ember run --max-restarts``
sets it to ``auto`` so that restarted workers resume)."""


def _checkpointer(hook: Any) -> Checkpointer | None:
    """The :class:`~ember.checkpoint.Checkpointer` a hook keeps checkpoints with (the
    :class:`~ember.trainer.hooks.CheckpointHook`'s ``checkpointer``), or None."""
    found = getattr(hook, "checkpointer", None)
    return found if isinstance(found, Checkpointer) else None


def check_resume(resume: Any) -> None:
    """Validate ``fit(resume=...)`` before anything changes."""
    if resume is not None and not isinstance(resume, str | os.PathLike):
        raise TrainerError(f"fit(resume=...) takes None, 'auto' or a checkpoint path, got {type(resume).__name__}")
    if isinstance(resume, str) and not resume:
        raise TrainerError("fit(resume='') is empty: pass None, 'auto' or a checkpoint path")


def checkpointers(hooks: Iterable[Any]) -> list[Checkpointer]:
    """The checkpointers of ``hooks`` (the registered ones, in the order they run)."""
    return [c for h in hooks if (c := _checkpointer(h)) is not None]


def resume_checkpoint(resume: Any, hooks: list[Checkpointer], owner: TrainingState, logger: DistributedLogger) -> Any:
    """Load the checkpoint ``resume`` names into ``owner`` (a collective); return the RNG state to apply.

    ``hooks`` are the checkpointers of the registered hooks (:func:`checkpointers`): ``"auto"``
    looks in their directory, and they are told which file the run resumed from.

    ``"auto"``: the newest readable checkpoint in the CheckpointHook's directory (a damaged one
    is skipped with a warning, and set aside as ``NAME.damaged``); none there: say so and return
    None (start fresh). A path: that file, or the newest in that directory (set aside as with
    ``"auto"`` when it is a CheckpointHook's directory); missing or damaged: CheckpointError.
    """
    from_env = resume is None
    if from_env:
        resume = os.environ.get(RESUME_ENV, "").strip() or None
        if resume is None:
            return None
    auto = resume == "auto"
    if auto:
        dirs = list(dict.fromkeys(h.dir for h in hooks))
        if len(dirs) != 1:
            if not dirs and from_env:
                logger.warning(f"{RESUME_ENV}=auto, but no CheckpointHook is registered: starting fresh", ranks=[0])
                return None
            found = f"CheckpointHooks on {[str(d) for d in dirs]}" if dirs else "no CheckpointHook"
            raise TrainerError(
                f"resume='auto' looks in the directory of the one CheckpointHook, but fit has {found}: "
                "pass resume=PATH to choose"
            )
        target = dirs[0]
        if target.exists() and not target.is_dir():  # else its content would be read as a checkpoint
            raise CheckpointError(
                f"resume='auto' looks in the CheckpointHook's directory {str(target)!r}, which is not a folder: "
                "give the hook a folder (or a path that does not exist yet)"
            )
    else:
        target = Path(resume)
    # The folder this fit saves into: its checkpointer finds the newest good checkpoint and sets a
    # damaged one aside (the run will come back to its step and save under its name).
    own = next((h for h in hooks if h.dir.resolve() == target.resolve()), None)
    if own is not None:
        found_ckpt = own.latest_good(logger, missing_ok=auto)
    else:
        found_ckpt = open_checkpoint(target, logger, missing_ok=auto)
    if found_ckpt is None:
        if auto:
            logger.info(f"resume='auto': no checkpoint in {str(target)!r} yet: starting fresh", ranks=[0])
            return None
        raise CheckpointError(f"no checkpoint in {str(target)!r} to resume from")
    path, state = found_ckpt
    rng = restore_from(path, state, owner)
    for hook in hooks:
        hook.resumed_from = path
    meta = state["meta"]
    logger.info(
        f"resumed from {str(path)!r}: epoch {meta['epoch']}, {meta['epoch_iter']} batches into it, step {meta['step']}",
        ranks=[0],
    )
    return rng


def raise_if_preempted(preempted: bool, reason: str | None, hooks: list[Checkpointer]) -> None:
    """After ``fit``'s loop: leave with :class:`Preempted` when the ranks agreed on a preemption
    (``reason``: the stop's; ``hooks``: the checkpointers, the first one's last save is named)."""
    if preempted:
        raise Preempted(reason or "preempted", hooks[0].last_path if hooks else None)
