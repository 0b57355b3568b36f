"""Checkpoints during ``fit``: periodic, best, last and on preemption, with retention."""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import torch
from torch.utils.hooks import RemovableHandle

from ember import distributed
from ember.batch import batches_per_epoch
from ember.checkpoint import AsyncWriter, checkpoint_name, find_checkpoints, folder
from ember.checkpoint.io import BEST_POINTER, remove_checkpoint, remove_stale_temporaries, save_file, write_pointer
from ember.checkpoint.sharded import is_sharded, obstacles, save_sharded
from ember.checkpoint.snapshot import capture
from ember.checkpoint.state import DeferredCopy, StagingBuffers
from ember.errors import CheckpointError, HookError
from ember.trainer.hooks._util import epoch_value
from ember.trainer.hooks.base import BaseHook, Priority

__all__ = ["CheckpointHook"]

_Key = tuple[int, int, int, int]


class CheckpointHook(BaseHook):
    """Save the whole training state to ``dir`` so that ``fit(resume="auto")`` continues exactly.

    What is saved, and the files' layout, are in ``docs/checkpoint.md``. Files are named
    ``ckpt-e<epoch>-s<step>.ckpt`` (epochs completed, optimizer updates) and written atomically
    by rank 0; ``last_checkpoint`` names the newest, ``best_checkpoint`` the best. When the
    Engine's state is sharded (FSDP2 / tensor parallelism), each checkpoint is instead a
    directory of that name in which every rank writes its shards with
    ``torch.distributed.checkpoint`` (see :mod:`ember.checkpoint.sharded`). Runs at
    ``Priority.LOWEST`` so every other hook has finished the event it saves in. One
    CheckpointHook per directory.

    When it saves:

    * every ``every_n_steps`` optimizer updates (at the end of the update's batch);
    * every ``every_n_epochs`` epochs, at the epoch's end (after its test pass and every other
      hook's ``after_train_epoch``): the state then describes the next epoch's start;
    * with ``save_best``, at the end of an epoch where that history metric improved;
    * with ``save_last``, when ``fit`` ends (finished or stopped): in ``after_train_loop``,
      before any hook's ``after_train``;
    * on preemption (SIGTERM/SIGINT, see ``docs/checkpoint.md``), always.

    Args:
        dir: the directory (created on rank 0; shared by all ranks for resuming).
        every_n_steps: optimizer updates between saves (None: not by steps).
        every_n_epochs: epochs between saves (None: not by epochs).
        keep_last: how many of the newest checkpoints to keep (None: all). The best one and the
            one this fit resumed from are never deleted.
        save_best: a history metric (``"test/accuracy"``) whose best epoch is kept as well.
        mode: ``"max"`` (the default) or ``"min"``: which way ``save_best`` is better. Given, it
            is also the metric's mode in a ``TrackingHook``'s run (:meth:`metric_modes`).
        save_last: save the final state when ``fit`` ends.
        async_save: write in a background thread. The state is copied to CPU memory first: the
            optimizer's state (on the CPU), which nothing but the optimizer step changes, in the
            background while the next batch's forward and backward pass run (the optimizer
            step, and the next hook to run, wait for that copy); everything else at once, in
            the training thread. The next save, and the end of ``fit``, wait for the write.
            Single-file checkpoints only: sharded ones are written synchronously (a warning
            says so once).
        background_copy: with ``async_save``, copy the parameters (those on the CPU) in the
            background too. Only for models whose weights nothing but the optimizer step
            changes in place: a change torch counts (``nn.Embedding(max_norm=...)``) refuses
            the checkpoint with a ``CheckpointError``; one through ``.data`` would go unseen
            (``docs/checkpoint.md``).
        skip_zip_crc: opt-in: write the files' zip records without CRC-32s (sharded: the state
            file). Saves take less time (the CRCs are a quarter to a third of ``torch.save``'s
            CPU time on 100-300 MB: ``docs/performance.md``), but the files' CRC fields are
            zero, so ``unzip -t`` and Python's ``zipfile`` report every member as damaged;
            ``torch.load`` never checks them and resuming works as usual. Off by default: the files pass ``unzip -t``.
        priority: default ``LOWEST`` (after every other hook).
        name: the hook's name (its own state, the best value, is saved under it).

    Attributes:
        last_path: the newest checkpoint this hook wrote (or is writing), or None.
        stall_s: seconds training waited for this hook's saves in the last ``fit``: the
            synchronous writes, or with ``async_save`` the copies to CPU memory and the waits
            for a background copy or for the previous write (the wait for the last write when
            ``fit`` ends is not counted; a background copy still running then is).
        best_path: the best checkpoint by ``save_best``, or None.
        resumed_from: the checkpoint ``fit(resume=...)`` continued from, or None.

    Example:
        >>> ckpt = hooks.CheckpointHook("ckpt", every_n_epochs=1, keep_last=3, save_best="test/accuracy")
        >>> trainer.fit(train_dl, epochs=10, test_dataloader=test_dl, hooks=[hooks.AccuracyHook(), ckpt],
        ...             resume="auto")
    """

    priority = Priority.LOWEST

    def __init__(
        self,
        dir: str | os.PathLike[str],
        every_n_steps: int | None = None,
        every_n_epochs: int | None = 1,
        keep_last: int | None = 3,
        save_best: str | None = None,
        mode: Literal["max", "min"] | None = None,
        save_last: bool = True,
        async_save: bool = False,
        background_copy: bool = False,
        skip_zip_crc: bool = False,
        priority: int | str | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(priority, name)
        if not isinstance(dir, str | os.PathLike) or not str(dir):
            raise HookError(f"CheckpointHook(dir=...) must be a directory path, got {dir!r}")
        for arg, value in (("every_n_steps", every_n_steps), ("every_n_epochs", every_n_epochs),
                           ("keep_last", keep_last)):  # fmt: skip
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise HookError(f"CheckpointHook({arg}=...) must be a positive int or None, got {value!r}")
        if save_best is not None and (not isinstance(save_best, str) or "/" not in save_best):
            raise HookError(f"CheckpointHook(save_best=...) must be a history name like 'test/loss', got {save_best!r}")
        if mode not in (None, "max", "min"):
            raise HookError(f"CheckpointHook(mode=...) must be 'max' or 'min', got {mode!r}")
        self.dir = Path(dir)
        self.every_n_steps, self.every_n_epochs, self.keep_last = every_n_steps, every_n_epochs, keep_last
        self.save_best, self.save_last, self.async_save = save_best, bool(save_last), bool(async_save)
        self.mode: Literal["max", "min"] = mode or "max"
        self._mode_given = mode is not None
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.best_path: Path | None = None
        self.last_path: Path | None = None
        self.resumed_from: Path | None = None
        self.skip_zip_crc = bool(skip_zip_crc)
        self._writer = AsyncWriter(skip_zip_crc=self.skip_zip_crc)
        self._staging = StagingBuffers()  # async_save: CPU copies reused from save to save
        self._staging_prepared = False
        self._saved: _Key | None = None
        self._warned_sync = False
        self.background_copy = bool(background_copy)
        if self.background_copy and not self.async_save:
            raise HookError("CheckpointHook(background_copy=True) needs async_save=True")
        self._copying: DeferredCopy | None = None  # async_save: the last save's background copies, until checked
        self._last_finite: Path | None = None  # the newest checkpoint saved before any non-finite loss
        self._step_hook: RemovableHandle | None = None
        self._folder: folder.FolderLock | None = None  # rank 0, during fit: the folder's lock
        self.stall_s = 0.0

    def metric_modes(self) -> dict[str, Literal["max", "min"]]:
        """``save_best`` with the mode it was given: ``{"test/accuracy": "max"}`` (``{}`` without
        ``save_best``, or when ``mode`` was left to its default).

        A ``TrackingHook`` in the same Trainer records it in its run (``Run.define_metric``), so
        the console's and ``ember runs compare``'s "best" of the metric follow it, not its name.

        Example:
            >>> hooks.CheckpointHook("ckpt", save_best="test/score_gap", mode="min").metric_modes()
            {'test/score_gap': 'min'}
        """
        return {self.save_best: self.mode} if self.save_best is not None and self._mode_given else {}

    # -- lifecycle ----------------------------------------------------------------------------
    def after_hook_is_attached(self) -> None:
        """Refuse a second CheckpointHook on the same directory (they would delete each other's files)."""
        for hook in self.trainer.hooks:
            if hook is not self and isinstance(hook, CheckpointHook) and hook.dir.resolve() == self.dir.resolve():
                raise HookError(f"hooks {hook.name!r} and {self.name!r} both save to {str(self.dir)!r}: use one each")

    def before_train(self) -> None:
        """Create the directory, lock it for this fit (one writing trainer per folder), remove
        temporaries of writes a crash interrupted, and refuse anything named like a checkpoint
        that a save could not replace (rank 0)."""
        self.stall_s = 0.0
        if distributed.rank() == 0:
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CheckpointError(
                    f"{self.name} cannot use the checkpoint directory {str(self.dir)!r}: {exc.strerror or exc}"
                ) from None
            self._release_folder()
            self._folder = folder.lock(self.dir, f"CheckpointHook {self.name!r}")
            try:
                remove_stale_temporaries(self.dir)
            except OSError as exc:
                raise CheckpointError(
                    f"{self.name} cannot use the checkpoint directory {str(self.dir)!r}: {exc.strerror or exc}"
                ) from None
            blocked = obstacles(self.dir)
            if blocked:
                raise CheckpointError(
                    f"{str(blocked[0])!r} is named like a checkpoint but is neither a checkpoint file nor a sharded "
                    f"checkpoint's directory, so a save under that name would fail after the training it keeps "
                    f"({len(blocked)} such entr{'ies' if len(blocked) > 1 else 'y'} in {str(self.dir)!r}): move it "
                    "out of the checkpoint directory"
                )
        if self._step_hook is not None:  # an earlier fit that ended without after_train
            self._step_hook.remove()
            self._step_hook = None
        if self.async_save:
            # The optimizer step changes its state (and the parameters) in place: a background
            # copy of them must be complete before it runs.
            self._step_hook = self.trainer.engine.optimizer.register_step_pre_hook(self._before_step)

    def after_update(self) -> None:
        """Save every ``every_n_steps`` optimizer updates."""
        t, n = self.trainer, self.every_n_steps
        if self.async_save and not self._staging_prepared:
            self._prepare_staging()
        if n is None or t.cur_step % n:
            return
        if self._epoch_save_due() and t.epoch_iter == batches_per_epoch(t.train_dataloader):
            return  # the epoch ends with this batch and saves then
        self._save(t.cur_epoch, t.epoch_iter, "step")

    def after_train_epoch(self) -> None:
        """Save every ``every_n_epochs`` epochs, and when ``save_best`` improved."""
        t = self.trainer
        improved = False
        if self.save_best is not None:
            value = epoch_value(t, self.save_best, "CheckpointHook(save_best=...)")
            if value is not None and self._better(value):
                improved = True
                self.best, self.best_epoch = value, t.cur_epoch
                self.best_path = self.dir / checkpoint_name(t.cur_epoch + 1, t.cur_step)  # in the state it saves
        if improved or self._epoch_save_due():
            self._save(t.cur_epoch + 1, 0, "best" if improved and not self._epoch_save_due() else "epoch", improved)

    def after_train(self) -> None:
        """Wait for a background write to finish (raising its error, if any); release the folder."""
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None
        try:
            self.wait()
        finally:
            self._release_folder()

    def _release_folder(self) -> None:
        held, self._folder = self._folder, None
        if held is not None:
            held.release()

    def events(self) -> list[str]:
        """The lifecycle methods called: ``after_update`` only when it has something to do."""
        per_update = self.every_n_steps is not None or self.async_save
        return [e for e in super().events() if per_update or e != "after_update"]

    def after_train_loop(self) -> None:
        """Save the state ``fit`` ends with (with ``save_last``, or on preemption) and wait for it.

        Runs on every rank when the loop ends without an error, before any ``after_train``; a
        collective.
        """
        t = self.trainer
        preempted = t.preempted
        if not (preempted or self.save_last):
            return
        path = self._save(t.cur_epoch, t.epoch_iter, "preempt" if preempted else "final")
        self.wait()
        if preempted:
            t.logger.warning(f"{t.stop_reason}: saved {str(path)!r}", ranks=[0])

    def wait(self) -> None:
        """Block until the background write (if any) is done; raise CheckpointError if it failed."""
        self._await_copy()
        self._writer.wait()

    # -- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The best value so far, its epoch, and its file's name."""
        best = None if self.best_path is None else self.best_path.name
        return {"best": self.best, "best_epoch": self.best_epoch, "best_path": best}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (the best file is looked for in ``dir``)."""
        missing = {"best", "best_epoch", "best_path"} - set(state)
        if missing:
            raise HookError(f"hook {self.name!r}: state lacks {sorted(missing)}; pass what state_dict() returned")
        self.best, self.best_epoch = state["best"], state["best_epoch"]
        self.best_path = None if state["best_path"] is None else self.dir / state["best_path"]

    # -- helpers ------------------------------------------------------------------------------
    def _prepare_staging(self) -> None:
        """After the first update (the optimizer state exists now), let the staging buffers of
        the first async save be allocated in the background rather than during that save."""
        self._staging_prepared = True
        engine = self.trainer.engine
        if distributed.rank() != 0 or is_sharded(engine):
            return
        tensors = [t for t in engine.model.state_dict().values() if isinstance(t, torch.Tensor)]
        tensors += [t for s in engine.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        self._staging.prepare(tensors)

    def _epoch_save_due(self) -> bool:
        n = self.every_n_epochs
        return n is not None and (self.trainer.cur_epoch + 1) % n == 0

    def _better(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if self.best is None:
            return True
        return value > self.best if self.mode == "max" else value < self.best

    def _save(self, epoch: int, epoch_iter: int, reason: str, best: bool = False) -> Path:
        """Capture the state (a collective) and write it on rank 0, unless this very state was just saved."""
        t = self.trainer
        path = self.dir / checkpoint_name(epoch, t.cur_step)
        key = (epoch, epoch_iter, t.cur_step, t.micro_step)
        if key == self._saved:
            return path
        self._await_copy()  # counts its own wait
        started = time.perf_counter()
        try:
            self._writer.wait()  # one write at a time; its error surfaces here
            self._write(path, key, reason, best, self._nonfinite_step(path))
        finally:
            self.stall_s += time.perf_counter() - started
        return path

    def _nonfinite_step(self, path: Path) -> int | None:
        """The step of the first non-finite loss so far (None: none), said in a warning when there is one.

        With ``nonfinite_loss="error"`` (the default) such a loss stops training instead (raised
        here when its flag was still on its way from an accelerator), so no checkpoint of the
        weights it produced is written.
        """
        check = getattr(self.trainer.engine, "check_loss", None)
        first = None if check is None else check()
        if first is not None:
            kept = "" if self._last_finite is None else f"; retention keeps {self._last_finite.name}, saved before it"
            self.trainer.logger.warning(
                f"{self.name}: {path.name} is saved after a non-finite loss at step {first} "
                f"(nonfinite_loss='warn'): its weights may be non-finite{kept}",
                ranks=[0],
            )
        return first

    def _write(self, path: Path, key: _Key, reason: str, best: bool, nonfinite: int | None = None) -> None:
        t = self.trainer
        protected = self._last_finite if nonfinite is not None else None
        keep = frozenset(p.name for p in (self.best_path, self.resumed_from, path, protected) if p is not None)
        if nonfinite is None:
            self._last_finite = path
        then = functools.partial(self._after_write, path.name, best, keep)
        if is_sharded(t.engine):
            if self.async_save and not self._warned_sync:
                t.logger.warning(
                    f"{self.name}: async_save applies to single-file checkpoints; the sharded checkpoints of "
                    f"{t.engine.parallel.name} are written synchronously by every rank",
                    ranks=[0],
                )
                self._warned_sync = True
            # a collective; rank 0 calls then()
            save_sharded(path, t, reason=reason, then=then, skip_zip_crc=self.skip_zip_crc)
            self._saved, self.last_path = key, path
            return
        if not self.async_save:
            state = capture(t, reason=reason)
            self._saved, self.last_path = key, path
            if state is not None:
                save_file(state, path, skip_zip_crc=self.skip_zip_crc)
                then()
            return
        defer = _changed_only_by_step(t.engine.optimizer, with_params=self.background_copy)
        state = capture(t, reason=reason, copy=self._staging, defer=defer)
        self._saved, self.last_path = key, path
        if state is not None:
            self._copying = self._staging.take_deferred()
            self._writer.submit(state, path, then, prepare=None if self._copying is None else self._copying.run)
            if self._copying is not None:
                t.run_before_next_hook(self._await_copy)

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._await_copy()

    def _await_copy(self) -> None:
        """Wait until the background copy of the last save is made, then check it (training thread)."""
        copying, self._copying = self._copying, None
        if copying is None:
            return
        started = time.perf_counter()
        copying.wait_copied()
        copying.check()
        self.stall_s += time.perf_counter() - started

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


def _changed_only_by_step(optimizer: torch.optim.Optimizer, with_params: bool) -> Callable[[torch.Tensor], bool]:
    """Whether a tensor shares memory with ``optimizer``'s state (or, ``with_params``, its
    parameters): what only its step changes in place, so an async save may copy it in the
    background until then. The parameters only on request: a model's forward may write them."""
    tensors = [p for group in optimizer.param_groups for p in group["params"]] if with_params else []
    tensors += [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr() for t in tensors}
    storages.discard(0)  # empty tensors have no memory to share
    return lambda t: t.untyped_storage().data_ptr() in storages
