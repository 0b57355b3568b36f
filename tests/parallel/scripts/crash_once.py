"""``ember run --nproc 2 --max-restarts 1``: a Trainer with a CheckpointHook whose rank 1 dies once.

Usage: ``crash_once.py OUT CRASH_STEP``. Two jobs, one after the other in the same workers:

* the uninterrupted reference (first life only, ``EMBER_RESUME`` unset as in a launch without
  restarts): checkpoints in ``OUT/ref/ckpt``, reports in ``OUT/ref``;
* the crashing job: on its first life rank 1 calls ``os._exit(1)`` right after update
  CRASH_STEP and leaves ``OUT/crash/marker`` behind; torchrun restarts both workers,
  ``fit(resume=None)`` reads ``EMBER_RESUME=auto`` and continues from the newest checkpoint in
  ``OUT/crash/ckpt``; reports in ``OUT/crash``.

Rank 0 reports (``rank0.json``) the final parameters and how each job started. One launch
instead of two saves a torchrun start-up (each ``import torch`` in every process).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from tests.parallel.common import dataset, mlp
from torch import nn

import ember
from ember.trainer import Trainer, hooks
from ember.trainer.hooks.base import BaseHook

torch.set_num_threads(1)


class CrashOnce(BaseHook):
    """Kill rank 1 right after update ``step``, the first time only (the marker remembers)."""

    def __init__(self, step: int, marker: Path) -> None:
        super().__init__()
        self.step, self.marker = step, marker

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        due = self.trainer.step_applied and self.trainer.cur_step == self.step
        if due and ember.context.rank == 1 and not self.marker.exists():
            self.marker.write_text("crashed")
            os._exit(1)


def job(out: Path, crash_step: int) -> None:
    """Train 2 epochs with checkpoints every 2 updates in ``out/ckpt``; rank 0 reports into ``out``."""
    model = mlp()
    engine, train_dl, _, _ = ember.initialize(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        nn.CrossEntropyLoss(),
        ember.get_dataloader(dataset(96), shuffle=True, batch_size=8),
    )
    ckpt = hooks.CheckpointHook(out / "ckpt", every_n_steps=2, every_n_epochs=None)
    trainer = Trainer(engine)
    trainer.fit(train_dl, epochs=2, hooks=[ckpt, CrashOnce(crash_step, out / "marker"), hooks.LossHook()])
    report = {
        "rank": ember.context.rank,
        "params": {k: v.tolist() for k, v in engine.model.state_dict().items()},
        "steps": trainer.cur_step,
        "resumed_from": None if ckpt.resumed_from is None else ckpt.resumed_from.name,
        "losses": trainer.history.values("train/loss"),
    }
    (out / f"rank{ember.context.rank}.json").write_text(json.dumps(report))


def main() -> None:
    out, crash_step = Path(sys.argv[1]), int(sys.argv[2])
    ember.launch_from_torch(config={"seed": 0, "deterministic": True}, verbose=False)
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        resume_env = os.environ.pop("EMBER_RESUME")  # set by --max-restarts; the reference runs without
        job(out / "ref", 0)
        os.environ["EMBER_RESUME"] = resume_env
    job(out / "crash", crash_step)


if __name__ == "__main__":
    main()
