"""Checkpoints of the whole training state: atomic files that resume a run exactly.

The Trainer's :class:`~ember.trainer.hooks.CheckpointHook` and ``trainer.fit(resume=...)`` use
these functions; call them yourself for a hand-written schedule. Every function that takes a
trainer or an engine is a collective under several processes: call it on every rank. Rank 0
writes; every rank reads (the directory must be visible to all ranks). When the Engine's state is
sharded (FSDP2 / tensor parallelism) a checkpoint is a directory of ``torch.distributed.checkpoint``
files that every rank writes its shards into (:mod:`ember.checkpoint.sharded`); it loads into
any number of processes and layout. See ``docs/checkpoint.md``.

Example:
    >>> from ember import checkpoint
    >>> checkpoint.save("ckpt/manual.ckpt", trainer)          # everything, on every rank
    >>> checkpoint.load("ckpt/manual.ckpt", trainer)          # before trainer.fit(...): it continues
    >>> checkpoint.save_model("model.pt", trainer.engine)     # bare weights for model.load_state_dict
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ember import distributed
from ember.checkpoint.checkpointer import Checkpointer
from ember.checkpoint.io import (
    POINTER,
    SUFFIX,
    AsyncWriter,
    CheckpointFile,
    checkpoint_name,
    find_checkpoints,
    load_file,
    read_pointer,
    save_file,
    write_error,
)
from ember.checkpoint.opening import open_checkpoint, restore_from
from ember.checkpoint.opening import read as _read
from ember.checkpoint.snapshot import (
    Checkpointables,
    HookStates,
    Stateful,
    TrainingState,
    agree_on_error,
)
from ember.checkpoint.state import set_rng_state
from ember.errors import CheckpointError

if TYPE_CHECKING:
    from ember.engine import Engine

__all__ = [
    "POINTER",
    "SUFFIX",
    "AsyncWriter",
    "CheckpointError",
    "CheckpointFile",
    "Checkpointables",
    "Checkpointer",
    "HookStates",
    "Stateful",
    "TrainingState",
    "agree_on_error",
    "checkpoint_name",
    "find_checkpoints",
    "latest",
    "load",
    "load_file",
    "model_state",
    "open_checkpoint",
    "read",
    "read_pointer",
    "save",
    "save_file",
    "save_model",
    "write_error",
]

PathLike = str | os.PathLike[str]


def save(
    path: PathLike, trainer: TrainingState, extra: Mapping[str, Any] | None = None, skip_zip_crc: bool = False
) -> Path | None:
    """Write ``trainer``'s whole state to ``path`` (atomically); a collective.

    Saved: the Engine (model with unwrapped keys, optimizer, precision/scaler, accumulation
    counters and, mid-cycle, every rank's partial gradients), the trainer's counters and
    history, every hook's state under its name, every rank's random generators, the sampler's
    epoch and position, and metadata. Under FSDP2/tensor parallelism ``path`` becomes a sharded
    checkpoint directory, each rank writing its shards (:mod:`ember.checkpoint.sharded`); save
    at an accumulation boundary there (the Engine raises otherwise).

    Args:
        path: the file (or, sharded, the directory) to write; its parent is created.
        trainer: the Trainer (or another :class:`TrainingState`); call from outside ``fit``,
            or from a hook.
        extra: your own entries (numbers, strings, tensors and containers of them), kept in
            the metadata as ``meta["extra"]``: :func:`load` returns them.
        skip_zip_crc: opt-in: write the file's zip records without CRC-32s (sharded: the state
            file; DCP's shard files are not zips). Saves take less time (the CRCs are a quarter
            to a third of ``torch.save``'s CPU time on 100-300 MB: ``docs/performance.md``), but
            ``unzip -t`` and Python's ``zipfile`` then report every member as damaged;
            ``torch.load`` and :func:`load` never check them. By default the CRCs are kept
            (:func:`ember.checkpoint.io.save_file`).

    Returns:
        ``path`` on rank 0 (on every rank when sharded), None on the other ranks.

    Raises:
        CheckpointError: on every rank, when rank 0 could not write the file.

    Example:
        >>> checkpoint.save("ckpt/before-surgery.ckpt", trainer)
        >>> checkpoint.save("ckpt/fast.ckpt", trainer, skip_zip_crc=True)  # faster; fails unzip -t
    """
    return Checkpointer.write(path, trainer, extra=extra, skip_zip_crc=skip_zip_crc)


def load(path: PathLike, trainer: TrainingState, strict: bool = True) -> dict[str, Any]:
    """Restore a checkpoint into ``trainer`` so that the next ``fit`` continues it; a collective.

    Loads the Engine, the trainer's counters and history, the hooks' states (applied when
    ``fit`` registers hooks with those names, if it has not yet) and this rank's random
    generators. Prefer ``trainer.fit(..., resume=path)``, which also keeps the random state
    untouched until the first batch.

    Args:
        path: a checkpoint (file, or sharded checkpoint directory), or a directory of them (its
            newest loadable one).
        trainer: the Trainer (or another :class:`TrainingState`) to restore into (a sharded
            checkpoint loads into any number of processes: one, DDP, FSDP2 and/or tensor parallel, resharded by DCP).
        strict: refuse a saved hook state whose hook is not registered.

    Returns:
        The checkpoint's metadata (``step``, ``epoch``, ``metrics``, ``extra`` when
        :func:`save` was given some...), plus ``path``.

    Raises:
        CheckpointError: the file is missing, truncated, corrupt or not a checkpoint.

    Example:
        >>> meta = checkpoint.load("ckpt", trainer); meta["step"]
    """
    found = open_checkpoint(path, trainer.logger)
    if found is None:
        raise CheckpointError(f"no checkpoint in {str(path)!r} (files named like 'ckpt-e0001-s000000100.ckpt')")
    chosen, state = found
    set_rng_state(restore_from(chosen, state, trainer, strict=strict))
    return {**state["meta"], "path": str(chosen)}


def save_model(path: PathLike, engine: Engine) -> Path | None:
    """Write the model's full weights alone, for ``model.load_state_dict(torch.load(path))``; a collective.

    ``.safetensors`` paths are written with the ``safetensors`` package (when installed), other
    paths with ``torch.save``; the parent folder is created, as :func:`save` does. Under
    FSDP2/tensor parallelism the shards are gathered first.

    Returns:
        ``path`` on rank 0, None on the other ranks.

    Example:
        >>> checkpoint.save_model("digits.pt", engine)
        >>> plain = Net(); plain.load_state_dict(torch.load("digits.pt"), strict=True)
    """
    from ember.checkpoint.export import full_model_state, write_weights

    weights = full_model_state(engine)
    error: Exception | None = None
    if distributed.rank() == 0:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            write_weights(weights, path)
        except (OSError, CheckpointError) as exc:
            error = exc if isinstance(exc, CheckpointError) else write_error(path, exc)
    agree_on_error(error, f"rank 0 could not write {str(path)!r}")
    return Path(path) if distributed.rank() == 0 else None


def read(path: PathLike, mmap: bool = False) -> dict[str, Any]:
    """Read a checkpoint into a dict (tensors on the CPU), checking that it is one.

    For a sharded checkpoint directory: its state file (everything but the model and
    optimizer, which stay in the shard files), after checking the shards are all there.

    Args:
        path: the checkpoint file or sharded checkpoint directory.
        mmap: map the file instead of reading it, so a tensor's bytes are read only when it is
            touched (copy-on-write: changing one never changes the file).

    Raises:
        CheckpointError: naming the file when it is missing, truncated, corrupt or not a checkpoint.
    """
    return _read(path, mmap=mmap)


def model_state(path: PathLike) -> dict[str, Any]:
    """The bare model weights inside a checkpoint (keys as in the plain model); a sharded
    checkpoint's shards are assembled into full tensors.

    A checkpoint file is mapped, not read: only the model's bytes are read (a training
    checkpoint of an Adam model holds twice as many bytes of optimizer state), and the tensors
    returned are copy-on-write views of the file."""
    from ember.checkpoint.sharded import full_model_state, is_checkpoint_dir

    if is_checkpoint_dir(path):
        return full_model_state(path)
    return dict(read(path, mmap=True)["engine"]["model"])


def latest(directory: PathLike) -> Path | None:
    """The newest complete checkpoint (file or sharded directory) in ``directory`` by step (not
    checked for damage), or None."""
    found = find_checkpoints(directory)
    return found[-1].path if found else None
