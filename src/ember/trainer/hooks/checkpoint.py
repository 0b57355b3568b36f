"""Checkpoints during ``fit``: the hook decides *when* (periodic, best, last, on preemption);
its :class:`~ember.checkpoint.Checkpointer` owns where, how and how many."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from ember.batch import batches_per_epoch
from ember.checkpoint import Checkpointer, checkpoint_name
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
        checkpointer: the :class:`~ember.checkpoint.Checkpointer` that saves (its folder, lock,
            format, writer, pointers and retention); ``dir``, ``keep_last``, ``async_save``... read it.
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
        for arg, value in (("every_n_steps", every_n_steps), ("every_n_epochs", every_n_epochs)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise HookError(f"CheckpointHook({arg}=...) must be a positive int or None, got {value!r}")
        if save_best is not None and (not isinstance(save_best, str) or "/" not in save_best):
            raise HookError(f"CheckpointHook(save_best=...) must be a history name like 'test/loss', got {save_best!r}")
        if mode not in (None, "max", "min"):
            raise HookError(f"CheckpointHook(mode=...) must be 'max' or 'min', got {mode!r}")
        try:
            self.checkpointer = Checkpointer(dir, keep_last, async_save, background_copy, skip_zip_crc,
                                             who="CheckpointHook")  # fmt: skip
        except CheckpointError as exc:  # a bad argument of this hook's
            raise HookError(str(exc)) from None
        self.every_n_steps, self.every_n_epochs = every_n_steps, every_n_epochs
        self.save_best, self.save_last = save_best, bool(save_last)
        self.mode: Literal["max", "min"] = mode or "max"
        self._mode_given = mode is not None
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.best_path: Path | None = None
        self._staging_prepared = False
        self._saved: _Key | None = None
        self._last_finite: Path | None = None  # the newest checkpoint saved before any non-finite loss

    # -- what the checkpointer owns, read through the hook -------------------------------------
    @property
    def dir(self) -> Path:
        """The checkpoint folder (:attr:`Checkpointer.dir <ember.checkpoint.Checkpointer.dir>`)."""
        return self.checkpointer.dir

    @property
    def keep_last(self) -> int | None:
        """How many of the newest checkpoints retention keeps (None: all)."""
        return self.checkpointer.keep_last

    @property
    def async_save(self) -> bool:
        """Whether checkpoints are written in the background."""
        return self.checkpointer.async_save

    @property
    def background_copy(self) -> bool:
        """Whether an async save copies the parameters in the background too."""
        return self.checkpointer.background_copy

    @property
    def skip_zip_crc(self) -> bool:
        """Whether the files' zip records are written without CRC-32s."""
        return self.checkpointer.skip_zip_crc

    @property
    def last_path(self) -> Path | None:
        """The newest checkpoint this hook wrote (or is writing), or None."""
        return self.checkpointer.last_path

    @property
    def resumed_from(self) -> Path | None:
        """The checkpoint ``fit(resume=...)`` continued from, or None."""
        return self.checkpointer.resumed_from

    @property
    def stall_s(self) -> float:
        """Seconds training waited for this hook's saves in the last ``fit``."""
        return self.checkpointer.stall_s

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
        """Open the checkpointer: rank 0 creates and locks the folder for this fit (one writing
        trainer per folder), removes temporaries of interrupted writes, and refuses anything
        named like a checkpoint that a save could not replace."""
        self.checkpointer.who = f"CheckpointHook {self.name!r}"
        self.checkpointer.open(self.trainer.engine)

    def after_update(self) -> None:
        """Save every ``every_n_steps`` optimizer updates."""
        t, n = self.trainer, self.every_n_steps
        if self.async_save and not self._staging_prepared:
            self._staging_prepared = True  # the optimizer state exists now
            self.checkpointer.prepare_staging(t.engine)
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
        self.checkpointer.close()

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
        self.checkpointer.wait()

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
        """Have the checkpointer save the state (a collective), unless this very state was just saved."""
        t = self.trainer
        name = checkpoint_name(epoch, t.cur_step)
        key = (epoch, epoch_iter, t.cur_step, t.micro_step)
        if key == self._saved:
            return self.dir / name
        self.checkpointer.await_copy()  # before the warning below: a copy's error comes first
        nonfinite = self._nonfinite_step(self.dir / name)
        protected = self._last_finite if nonfinite is not None else None
        path = self.checkpointer.save(t, name, reason, keep=(self.best_path, protected), best=best)
        self._saved = key
        if nonfinite is None:
            self._last_finite = path
        if self.checkpointer.copying:
            t.run_before_next_hook(self.checkpointer.await_copy)
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
