"""Checkpoints under torchrun with 2 gloo processes: every scenario in one launch.

``dist.py OUT ONE_PROC_CKPT`` under ``--max-restarts=3`` with ``EMBER_RESUME=auto`` (so
``fit(resume=None)`` resumes, as after ``ember run --max-restarts``) runs three jobs one after
the other in the same workers, restarted by torchrun four times in all (attempts 0-3):

``reference`` (attempt 0, ``EMBER_RESUME`` unset): the uninterrupted run (``OUT/reference/ref``,
checkpoints kept in ``OUT/reference/ref/ckpt``); a functional save in the middle of an
accumulation cycle loaded back with ``checkpoint.load`` (``OUT/reference/functional``); a
checkpoint written by one process continued by two (``OUT/reference/from-one-rank<r>.json``:
the samples each rank saw in the resumed epoch).

``chain`` (attempts 0-2, ``OUT/chain``): attempt 0's rank 0 is SIGKILLed between writing update
8's checkpoint and renaming it; attempt 1 resumes, and rank 1 alone gets SIGTERM at batch 23, so
both ranks save one update after the next (see ember.trainer._control) and exit with the
preemption code; attempt 2 resumes and finishes, writing ``OUT/chain/res``.
``OUT/chain/attempt<a>-rank<r>.json``: how each attempt of the chain ended.

``mid-cycle`` (attempts 2-3 of the launch, 0-1 of this job, ``OUT/mid-cycle``): once the chain
has finished, rank 0 prints :data:`MID_CYCLE_STARTS` (the test splits the output there: what
torchrun logs after it is about this job); attempt 0's rank 1 is SIGKILLed after batch 16 (epoch
1, the first batch of update 9's cycle: both ranks hold partial gradients); attempt 1 resumes
with ``resume="auto"`` and finishes, writing ``OUT/mid-cycle/res`` (and
``OUT/mid-cycle/attempt<a>-rank<r>.json``).

One launch instead of three saves two torchrun start-ups and two worker restarts (each
``import torch`` in every process).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
from tests.checkpoint import common
from tests.models import tiny_dataset

import ember
from ember import checkpoint, distributed
from ember.trainer import Preempted, hooks

torch.set_num_threads(1)


class SaveAndFail(hooks.BaseHook):
    """``checkpoint.save`` at batch ``at`` (mid-cycle), then fail: every rank stops at the next update."""

    priority = hooks.Priority.LOWEST

    def __init__(self, path: Path, at: int) -> None:
        super().__init__()
        self.path, self.at = path, at

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        if self.trainer.micro_step == self.at:
            checkpoint.save(self.path, self.trainer)
            raise RuntimeError("stopping after the save")


def functional(out: Path) -> None:
    path = out / "functional" / "mid-cycle.ckpt"
    trainer, train, test = common.build(deterministic=True)
    try:
        trainer.fit(train, epochs=3, test_dataloader=test, hooks=common.hook_list(trainer, SaveAndFail(path, 12)))
    except RuntimeError:
        pass
    trainer, train, test = common.build(deterministic=True)
    meta = checkpoint.load(path, trainer)
    trainer.fit(train, epochs=3, test_dataloader=test, hooks=common.hook_list(trainer, SaveAndFail(path, -1)))
    common.write_result(trainer, out / "functional")
    if distributed.rank() == 0:
        (out / "functional" / "meta.json").write_text(json.dumps({k: meta[k] for k in ("accumulation_micro_step",)}))


class SeenSamples(hooks.BaseHook):
    """The dataset indices each rank trains on in the epoch in progress when fit starts."""

    def __init__(self, x: torch.Tensor) -> None:
        super().__init__()
        self.rows = {tuple(r.tolist()): i for i, r in enumerate(x)}
        self.seen: list[int] = []

    def before_train(self) -> None:
        self.epoch = self.trainer.cur_epoch
        self.trainer.engine.model.register_forward_pre_hook(self._record)

    def _record(self, module: Any, args: Any) -> None:
        if module.training and self.trainer.cur_epoch == self.epoch:
            self.seen += [self.rows[tuple(r.tolist())] for r in args[0]]


def from_one_process(out: Path, path: str) -> None:
    trainer, train, test = common.build(deterministic=True, bs=4)
    seen = SeenSamples(tiny_dataset(common.N, 1).tensors[0])
    ckpt = hooks.CheckpointHook(out / "from-one", every_n_epochs=None, save_last=False)
    found = checkpoint.read(path)
    trainer.fit(train, epochs=3, test_dataloader=test, hooks=[*common.hook_list(trainer, ckpt), seen], resume=path)
    report = {"seen": seen.seen, "counters": [trainer.cur_epoch, trainer.cur_step], "loss": trainer.history.values(
        "train/loss"), "saved_epoch_iter": found["trainer"]["epoch_iter"], "epoch": seen.epoch}  # fmt: skip
    (out / f"from-one-rank{distributed.rank()}.json").write_text(json.dumps(report))


def reference(out: Path, one_proc_ckpt: str) -> None:
    common.run(out / "ref" / "ckpt", out / "ref", deterministic=True)
    functional(out)
    from_one_process(out, one_proc_ckpt)


def chain(out: Path, attempt: int) -> None:
    """Attempt 0 dies writing a checkpoint, attempt 1 is preempted, attempt 2 finishes (all resumed by torchrun)."""
    rank = distributed.rank()
    report: dict[str, Any] = {"finished": False}
    try:
        if attempt == 0 and rank == 0:
            common.die_renaming(8)  # SIGKILL rank 0 (the writer) before update 8's checkpoint is renamed
        if attempt == 2:
            common.run(out / "ckpt", out / "res", deterministic=True, resume=None)  # EMBER_RESUME=auto
        else:
            kill_at = 23 if attempt == 1 and rank == 1 else None  # SIGTERM to rank 1 only, mid-cycle
            trainer = common.run(out / "ckpt", kill_at=kill_at, sig=signal.SIGTERM, deterministic=True, resume=None)
            report["resumed_at"] = trainer.get_hook("Recorder").resumed_at  # type: ignore[attr-defined]
        report["finished"] = True
    except Preempted as exc:
        report.update(exit=exc.code, reason=exc.reason, path=None if exc.path is None else str(exc.path))
        raise
    finally:
        (out / f"attempt{attempt}-rank{rank}.json").write_text(json.dumps(report))


def mid_cycle(out: Path, attempt: int) -> None:
    """Attempt 0: SIGKILL rank 1 mid-epoch, mid-cycle; attempt 1 (torchrun's restart) resumes with "auto"."""
    rank = distributed.rank()
    report: dict[str, Any] = {"finished": False}
    try:
        kill_at = 16 if attempt == 0 and rank == 1 else None
        trainer = common.run(out / "ckpt", out / "res" if attempt else None, kill_at=kill_at, deterministic=True,
                             resume="auto")  # fmt: skip
        report.update(finished=True, resumed_at=trainer.get_hook("Recorder").resumed_at)  # type: ignore[attr-defined]
    finally:
        (out / f"attempt{attempt}-rank{rank}.json").write_text(json.dumps(report))


def main(out: Path, one_proc_ckpt: str) -> None:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt == 0:
        resume_env = os.environ.pop("EMBER_RESUME")  # the reference runs as its own launch would
        reference(out / "reference", one_proc_ckpt)
        os.environ["EMBER_RESUME"] = resume_env
    if attempt <= 2:
        chain(out / "chain", attempt)
    if distributed.rank() == 0:
        print(MID_CYCLE_STARTS, file=sys.stderr, flush=True)
    mid_cycle(out / "mid-cycle", attempt - 2)


MID_CYCLE_STARTS = "=== the chain has finished: the mid-cycle job starts"

if __name__ == "__main__":
    ember.launch_from_torch(config={"seed": 0, "deterministic": True}, verbose=False)
    main(Path(sys.argv[1]), sys.argv[2])
