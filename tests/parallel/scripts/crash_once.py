"""``ember run --nproc 2 --max-restarts 1``: a Trainer with a CheckpointHook whose rank 1 dies once.

Usage: ``crash_once.py CKPT_DIR MARKER CRASH_STEP`` (CRASH_STEP 0: never crash). On its first
life rank 1 calls ``os._exit(1)`` after update CRASH_STEP and leaves MARKER behind; torchrun
restarts both workers, ``fit(resume=None)`` reads ``EMBER_RESUME=auto`` and continues from the
newest checkpoint. Rank 0 reports the final parameters and how the run started.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
from tests.dist import report
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


def main() -> None:
    ckpt_dir, marker, crash_step = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    ember.launch_from_torch(config={"seed": 0, "deterministic": True}, verbose=False)
    model = mlp()
    engine, train_dl, _, _ = ember.initialize(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        nn.CrossEntropyLoss(),
        ember.get_dataloader(dataset(96), shuffle=True, batch_size=8),
    )
    ckpt = hooks.CheckpointHook(ckpt_dir, every_n_steps=2, every_n_epochs=None)
    trainer = Trainer(engine)
    trainer.fit(train_dl, epochs=2, hooks=[ckpt, CrashOnce(crash_step, marker), hooks.LossHook()])
    report(
        {
            "params": {k: v.tolist() for k, v in engine.model.state_dict().items()},
            "steps": trainer.cur_step,
            "resumed_from": None if ckpt.resumed_from is None else ckpt.resumed_from.name,
            "losses": trainer.history.values("train/loss"),
        }
    )


if __name__ == "__main__":
    main()
