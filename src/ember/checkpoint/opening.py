"""Reading a checkpoint to resume from: the newest that reads (damaged ones skipped, or set
aside), the same choice on every rank, and the load into a trainer.

:meth:`Checkpointer.latest_good <ember.checkpoint.Checkpointer.latest_good>`,
``ember.checkpoint.load`` and ``fit(resume=...)`` go through :func:`open_checkpoint` and
:func:`restore_from`; a state's walk back: ``io.load_file`` (or ``sharded.read_sharded``) →
``validate.check_state`` → ``snapshot.restore``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ember import distributed
from ember.checkpoint import folder
from ember.checkpoint.io import POINTER, find_checkpoints, load_file, read_pointer
from ember.checkpoint.sharded import is_checkpoint_dir, load_shards, read_sharded
from ember.checkpoint.snapshot import TrainingState, agree_on_error, restore
from ember.checkpoint.validate import check_state
from ember.errors import CheckpointError

if TYPE_CHECKING:
    from ember.logging import DistributedLogger

__all__ = ["open_checkpoint", "read", "restore_from"]

PathLike = str | os.PathLike[str]


def open_checkpoint(
    path: PathLike, logger: DistributedLogger, missing_ok: bool = False, set_aside_damaged: bool = False
) -> tuple[Path, dict[str, Any]] | None:
    """Read the checkpoint to resume from, on every rank; a collective.

    Rank 0 decides what to read and tells the others (so that ranks never disagree, e.g. while
    rank 0 creates the directory): for a directory, its newest readable checkpoint (a damaged
    one is skipped with a warning and, with ``set_aside_damaged``, renamed ``NAME.damaged`` by
    :func:`ember.checkpoint.folder.set_aside`, so that the resumed run can save under its name
    again); for a file or a sharded checkpoint directory, itself. None: the directory holds no
    readable checkpoint, or (with ``missing_ok``) ``path`` does not exist.

    Raises:
        CheckpointError: on every rank, when the file (or the one chosen) cannot be read on some rank.
    """
    path = Path(path)
    state: dict[str, Any] | None = None
    decision: str | None = ""  # "": read `path` itself; a name: read path/name; None: nothing
    if distributed.rank() == 0:
        if path.is_dir() and not is_checkpoint_dir(path):
            chosen, state = _newest_readable(path, logger, set_aside_damaged)
            decision = None if chosen is None else chosen.name
        elif missing_ok and not path.exists():
            decision = None
    decision = distributed.broadcast_object(decision)
    if decision is None:
        return None
    target = path / decision if decision else path
    error: Exception | None = None
    if state is None:
        try:
            state = read(target)
        except CheckpointError as exc:
            error = exc
    agree_on_error(error, f"another rank could not read checkpoint {str(target)!r}")
    assert state is not None
    return target, state


def _newest_readable(
    directory: Path, logger: DistributedLogger, set_aside_damaged: bool
) -> tuple[Path | None, dict[str, Any] | None]:
    for candidate in reversed(find_checkpoints(directory)):
        try:
            return candidate.path, read(candidate.path)
        except CheckpointError as exc:
            kept = folder.set_aside(candidate.path) if set_aside_damaged else None
            aside = f" (set aside as {kept.name!r}, kept for inspection)" if kept is not None else ""
            logger.warning(f"{exc}{aside}; falling back to the checkpoint before it", ranks=[0])
    pointer = read_pointer(directory)
    if pointer is not None and not (directory / pointer).exists():
        logger.warning(f"{directory / POINTER} names {pointer!r}, which does not exist", ranks=[0])
    return None, None


def restore_from(path: Path, state: Mapping[str, Any], owner: TrainingState, strict: bool = True) -> Any:
    """Load the checkpoint ``state`` read from ``path`` into ``owner``; return this rank's RNG state. A collective.

    A sharded checkpoint's model and optimizer are read from its shard files here, resharded
    into ``owner``'s layout, then everything goes through :func:`~ember.checkpoint.snapshot.restore`.
    """
    shards = load_shards(path, owner.checkpointables().engine) if "shards" in state else None
    return restore(state, owner, strict=strict, where=f"checkpoint {str(path)!r}", shards=shards)


def read(path: PathLike, mmap: bool = False) -> dict[str, Any]:
    """:func:`ember.checkpoint.read`: a checkpoint file or sharded directory, checked."""
    if is_checkpoint_dir(path):
        return read_sharded(path)
    state = load_file(path, mmap=mmap)
    check_state(state, f"checkpoint {str(path)!r}")
    return state
