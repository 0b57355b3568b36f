"""The :class:`Checkpointer`: where, how and how many checkpoints of one folder, as fvcore's.

It owns everything about a save but *when*: preparing the folder (creating it, taking its lock,
removing the temporaries of interrupted writes, refusing what a save could not replace),
choosing the format (a single file, or a sharded directory when the Engine's state is sharded),
writing synchronously or through the background writer, then pointing ``last_checkpoint`` (and
``best_checkpoint``) at the new file and applying retention. Resuming asks it for the newest
checkpoint that reads (:meth:`Checkpointer.latest_good`, through :mod:`ember.checkpoint.opening`),
which sets a damaged one aside.

``ember.checkpoint.save(path, trainer)`` is :meth:`Checkpointer.write` (one file, no folder
bookkeeping); the :class:`~ember.trainer.hooks.CheckpointHook` decides when its Checkpointer
saves, as detectron2's ``PeriodicCheckpointer`` does. A state's walk through a save:
``Checkpointer.save`` → :func:`~ember.checkpoint.snapshot.capture` (the collective that
gathers it) → :func:`~ember.checkpoint.io.save_file` (the atomic write), or
:func:`~ember.checkpoint.sharded.save_sharded` for sharded state.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ember import distributed
from ember.checkpoint import folder
from ember.checkpoint.io import (
    BEST_POINTER,
    AsyncWriter,
    find_checkpoints,
    remove_checkpoint,
    remove_stale_temporaries,
    save_file,
    write_error,
    write_pointer,
)
from ember.checkpoint.opening import open_checkpoint
from ember.checkpoint.sharded import is_sharded, obstacles, save_sharded
from ember.checkpoint.snapshot import TrainingState, agree_on_error, capture
from ember.checkpoint.state import DeferredCopy, StagingBuffers
from ember.errors import CheckpointError

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

    from ember.engine import Engine
    from ember.logging import DistributedLogger

__all__ = ["Checkpointer"]

PathLike = str | os.PathLike[str]


class Checkpointer:
    """One checkpoint folder: its preparation and lock, the format, the writes, pointers and retention.

    Args:
        dir: the folder (created on rank 0 by :meth:`open`; shared by all ranks for resuming).
        keep_last: how many of the newest checkpoints to keep (None: all). The one resumed from
            (:attr:`resumed_from`), the one just written and those a save names in ``keep``
            are never deleted.
        async_save: write single-file checkpoints in a background thread (the state is copied to
            CPU memory first; see :class:`~ember.trainer.hooks.CheckpointHook`). The next save,
            and :meth:`wait`, wait for the write. Sharded checkpoints are written synchronously.
        background_copy: with ``async_save``, copy the parameters (on the CPU) in the background
            too, not only the optimizer's state.
        skip_zip_crc: write the files' zip records without CRC-32s
            (:func:`~ember.checkpoint.io.save_file`).
        who: what saves through it, for the folder's holder file and the messages
            (``"CheckpointHook 'ckpt'"``).

    Attributes:
        last_path: the newest checkpoint written (or being written), or None.
        resumed_from: the checkpoint a resume read from this folder (never deleted), or None.
        stall_s: seconds the caller waited in :meth:`save` and for background copies since
            :meth:`open`.

    Raises:
        CheckpointError: a bad argument, named.

    Example:
        >>> ckpt = Checkpointer("ckpt", keep_last=3)
        >>> ckpt.open(trainer.engine)                           # rank 0 takes the folder
        >>> ckpt.save(trainer, "ckpt-e0001-s000000100.ckpt")    # a collective
        >>> ckpt.close()
    """

    def __init__(
        self,
        dir: PathLike,
        keep_last: int | None = None,
        async_save: bool = False,
        background_copy: bool = False,
        skip_zip_crc: bool = False,
        who: str = "Checkpointer",
    ) -> None:
        if not isinstance(dir, str | os.PathLike) or not str(dir):
            raise CheckpointError(f"{who}(dir=...) must be a directory path, got {dir!r}")
        if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1):
            raise CheckpointError(f"{who}(keep_last=...) must be a positive int or None, got {keep_last!r}")
        if background_copy and not async_save:
            raise CheckpointError(f"{who}(background_copy=True) needs async_save=True")
        self.dir = Path(dir)
        self.keep_last = keep_last
        self.async_save, self.background_copy = bool(async_save), bool(background_copy)
        self.skip_zip_crc = bool(skip_zip_crc)
        self.who = who
        self.last_path: Path | None = None
        self.resumed_from: Path | None = None
        self.stall_s = 0.0
        self._writer = AsyncWriter(skip_zip_crc=self.skip_zip_crc)
        self._staging = StagingBuffers()  # async_save: CPU copies reused from save to save
        self._copying: DeferredCopy | None = None  # async_save: the last save's background copies, until checked
        self._step_hook: RemovableHandle | None = None
        self._lock: folder.FolderLock | None = None  # rank 0, while open: the folder's lock
        self._warned_sync = False

    # -- the folder ---------------------------------------------------------------------------
    def open(self, engine: Engine | None = None) -> None:
        """Take the folder for this process's saves (rank 0) and, with ``async_save``, ``engine``'s optimizer step.

        Rank 0 creates the folder, locks it (one writing trainer per folder), removes
        temporaries of writes a crash interrupted, and refuses anything named like a checkpoint
        that a save could not replace. With ``async_save`` the optimizer step of ``engine``
        waits for a background copy first (it changes the copied tensors in place).

        Raises:
            CheckpointError: the folder cannot be created or locked, or holds an obstacle.
        """
        self.stall_s = 0.0
        if distributed.rank() == 0:
            self._prepare_folder()
        self._remove_step_hook()  # an earlier open without close
        if self.async_save and engine is not None:
            self._step_hook = engine.optimizer.register_step_pre_hook(self._before_step)

    def _prepare_folder(self) -> None:
        def unusable(exc: OSError) -> CheckpointError:
            return CheckpointError(
                f"{self.who} cannot use the checkpoint directory {str(self.dir)!r}: {exc.strerror or exc}"
            )

        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise unusable(exc) from None
        self._release_lock()
        self._lock = folder.lock(self.dir, self.who)
        try:
            remove_stale_temporaries(self.dir)
        except OSError as exc:
            raise unusable(exc) from None
        blocked = obstacles(self.dir)
        if blocked:
            raise CheckpointError(
                f"{str(blocked[0])!r} is named like a checkpoint but is neither a checkpoint file nor a sharded "
                f"checkpoint's directory, so a save under that name would fail after the training it keeps "
                f"({len(blocked)} such entr{'ies' if len(blocked) > 1 else 'y'} in {str(self.dir)!r}): move it "
                "out of the checkpoint directory"
            )

    def close(self) -> None:
        """Wait for a background write (raising its error, if any), then give the folder back."""
        self._remove_step_hook()
        try:
            self.wait()
        finally:
            self._release_lock()

    def _release_lock(self) -> None:
        held, self._lock = self._lock, None
        if held is not None:
            held.release()

    def _remove_step_hook(self) -> None:
        hook, self._step_hook = self._step_hook, None
        if hook is not None:
            hook.remove()

    # -- saving -------------------------------------------------------------------------------
    def save(
        self,
        owner: TrainingState,
        name: str,
        reason: str = "manual",
        keep: Iterable[Path | None] = (),
        best: bool = False,
    ) -> Path:
        """Save ``owner``'s state as ``dir/name``, point ``last_checkpoint`` at it, apply retention; a collective.

        Synchronous, or with ``async_save`` copied now and written in the background (a
        sharded state is always written now, by every rank). The previous background write is
        waited for first; its error is raised here.

        Args:
            owner: the Trainer (or another :class:`~ember.checkpoint.snapshot.TrainingState`).
            name: the checkpoint's name in the folder (:func:`~ember.checkpoint.io.checkpoint_name`).
            reason: kept in the metadata (``"epoch"``, ``"step"``, ``"final"``, ...).
            keep: more checkpoints retention must not delete (the best one...).
            best: also point ``best_checkpoint`` at it.

        Returns:
            The checkpoint's path.
        """
        path = self.dir / name
        self.await_copy()  # counts its own wait
        started = time.perf_counter()
        try:
            self._writer.wait()  # one write at a time; its error surfaces here
            self._save(owner, path, reason, best, keep)
        finally:
            self.stall_s += time.perf_counter() - started
        return path

    def _save(self, owner: TrainingState, path: Path, reason: str, best: bool, keep: Iterable[Path | None]) -> None:
        kept = frozenset(p.name for p in (*keep, self.resumed_from, path) if p is not None)
        then = functools.partial(self._after_write, path.name, best, kept)
        engine = owner.checkpointables().engine
        if is_sharded(engine) and self.async_save and not self._warned_sync:
            owner.logger.warning(
                f"{self.who}: async_save applies to single-file checkpoints; the sharded checkpoints of "
                f"{engine.parallel.name} are written synchronously by every rank",
                ranks=[0],
            )
            self._warned_sync = True
        if not self.async_save or is_sharded(engine):
            _write_now(path, owner, reason, then=then, skip_zip_crc=self.skip_zip_crc)
            self.last_path = path
            return
        defer = _changed_only_by_step(engine.optimizer, with_params=self.background_copy)
        state = capture(owner, reason=reason, copy=self._staging, defer=defer)
        self.last_path = path
        if state is not None:
            self._copying = self._staging.take_deferred()
            self._writer.submit(state, path, then, prepare=None if self._copying is None else self._copying.run)

    @property
    def copying(self) -> bool:
        """Whether the last save's background copy may still be running (:meth:`await_copy` ends it)."""
        return self._copying is not None

    def prepare_staging(self, engine: Engine) -> None:
        """With ``async_save``: allocate the first save's CPU buffers in the background now (after
        the first update, once the optimizer state exists), not during that save (rank 0)."""
        if not self.async_save or distributed.rank() != 0 or is_sharded(engine):
            return
        tensors = [t for t in engine.model.state_dict().values() if isinstance(t, torch.Tensor)]
        tensors += [t for s in engine.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        self._staging.prepare(tensors)

    def await_copy(self) -> None:
        """Wait until the background copy of the last save is made, then check it (training thread)."""
        copying, self._copying = self._copying, None
        if copying is None:
            return
        started = time.perf_counter()
        copying.wait_copied()
        copying.check()
        self.stall_s += time.perf_counter() - started

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.await_copy()

    def wait(self) -> None:
        """Block until the background write (if any) is done; raise CheckpointError if it failed."""
        self.await_copy()
        self._writer.wait()

    def _after_write(self, name: str, best: bool, keep: frozenset[str]) -> None:
        """Point at the new file and apply retention (rank 0; in the writer thread when async)."""
        write_pointer(self.dir, name)
        if best:
            write_pointer(self.dir, name, BEST_POINTER)
        if self.keep_last is None:
            return
        found = find_checkpoints(self.dir)
        newest = {f.path.name for f in found[-self.keep_last :]}
        for f in found:
            if f.path.name not in newest and f.path.name not in keep:
                remove_checkpoint(f.path)

    @staticmethod
    def write(
        path: PathLike,
        owner: TrainingState,
        reason: str = "manual",
        extra: Mapping[str, Any] | None = None,
        skip_zip_crc: bool = False,
    ) -> Path | None:
        """Write ``owner``'s whole state to ``path`` alone (no pointer, no retention); a collective.

        The format follows the Engine: a sharded directory when its state is sharded, else one
        atomic file. An error on rank 0 is raised on every rank. ``ember.checkpoint.save`` is this.

        Returns:
            ``path`` on rank 0 (on every rank when sharded), None on the other ranks.
        """
        return _write_now(Path(path), owner, reason, extra=extra, skip_zip_crc=skip_zip_crc, agree=True)

    # -- resuming -----------------------------------------------------------------------------
    def latest(self) -> Path | None:
        """The newest complete checkpoint in the folder by step (not checked for damage), or None."""
        found = find_checkpoints(self.dir)
        return found[-1].path if found else None

    def latest_good(self, logger: DistributedLogger, missing_ok: bool = True) -> tuple[Path, dict[str, Any]] | None:
        """The newest checkpoint of the folder that reads, and its state; a collective.

        A damaged one is skipped with a warning and set aside as ``NAME.damaged``
        (:func:`ember.checkpoint.folder.set_aside`): training will come back to its step and
        save under its name. None: the folder holds no readable checkpoint, or (with
        ``missing_ok``) does not exist; without it a missing folder is a CheckpointError.
        """
        return open_checkpoint(self.dir, logger, missing_ok=missing_ok, set_aside_damaged=True)


def _write_now(
    path: Path,
    owner: TrainingState,
    reason: str,
    extra: Mapping[str, Any] | None = None,
    then: Callable[[], None] | None = None,
    skip_zip_crc: bool = False,
    agree: bool = False,
) -> Path | None:
    """Capture ``owner``'s state and write it to ``path`` in the format its Engine needs, then ``then()``.

    A collective. Sharded: every rank writes its shards (errors are always agreed). One file:
    rank 0 writes; with ``agree`` an error there is raised on every rank, else on rank 0 only
    (a hook's error reaches the other ranks through the Trainer's agreement).
    """
    if is_sharded(owner.checkpointables().engine):
        return save_sharded(path, owner, reason=reason, then=then, extra=extra, skip_zip_crc=skip_zip_crc)
    state = capture(owner, reason=reason, extra=extra)
    error: Exception | None = None
    if state is not None:
        try:
            save_file(state, path, skip_zip_crc=skip_zip_crc)
            if then is not None:
                then()
        except (OSError, CheckpointError) as exc:
            error = exc if isinstance(exc, CheckpointError) else write_error(path, exc)
    if agree:
        agree_on_error(error, f"rank 0 could not write checkpoint {str(path)!r}")
    elif error is not None:
        raise error
    return path if state is not None else None


def _changed_only_by_step(optimizer: torch.optim.Optimizer, with_params: bool) -> Callable[[torch.Tensor], bool]:
    """Whether a tensor shares memory with ``optimizer``'s state (or, ``with_params``, its
    parameters): what only its step changes in place, so an async save may copy it in the
    background until then. The parameters only on request: a model's forward may write them."""
    tensors = [p for group in optimizer.param_groups for p in group["params"]] if with_params else []
    tensors += [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr() for t in tensors}
    storages.discard(0)  # empty tensors have no memory to share
    return lambda t: t.untyped_storage().data_ptr() in storages
