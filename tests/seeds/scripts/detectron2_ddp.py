"""A detectron2/LiBai trainer program under 2 processes (``torchrun``, gloo), imports rewritten.

As detectron2's and LiBai's default hooks do, the PeriodicCheckpointer and the PeriodicWriter
are registered on the main process only, and the checkpointer writes to disk there only. The
program trains uninterrupted, then again with a job that dies mid-way, then resumes that one.

Usage: torchrun --nproc_per_node 2 detectron2_ddp.py OUT_DIR
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tests.dist import report
from tests.models import tiny_dataset, tiny_mlp
from torch import nn
from torch.utils.data import DataLoader

from ember.compat.detectron2.checkpoint import DetectionCheckpointer
from ember.compat.detectron2.engine import HookBase, SimpleTrainer, hooks
from ember.compat.detectron2.utils.events import CommonMetricPrinter
from ember.errors import TrainerError

MAX_ITER, PERIOD, CRASH_AT = 20, 5, 13
IS_MAIN = int(os.environ["RANK"]) == 0  # detectron2.utils.comm.is_main_process()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = tiny_mlp()

    def forward(self, batch: Any) -> Any:
        x, y = batch
        logits = self.body(x)
        return {"loss_cls": F.cross_entropy(logits, y)} if self.training else logits


class CrashAt(HookBase):
    def before_step(self) -> None:
        if self.trainer.iter == CRASH_AT:
            raise RuntimeError("killed")


@torch.no_grad()
def evaluate(model: nn.Module) -> dict[str, float]:
    model.eval()
    x, y = tiny_dataset(128, seed=2).tensors
    accuracy = float((model((x, y)).argmax(1) == y).float().mean())
    model.train()
    return {"accuracy": accuracy}


def run(out: Path, resume: bool = False, crash: bool = False) -> Any:
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    trainer = SimpleTrainer(model, DataLoader(tiny_dataset(256), batch_size=16, shuffle=True), optimizer)
    checkpointer = DetectionCheckpointer(model, str(out), trainer=trainer, save_to_disk=IS_MAIN)
    trainer.register_hooks(
        [
            hooks.IterationTimer(),
            hooks.LRScheduler(scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=8, gamma=0.5)),
            hooks.PeriodicCheckpointer(checkpointer, PERIOD) if IS_MAIN else None,
            hooks.EvalHook(PERIOD, lambda: evaluate(model)),
            CrashAt() if crash else None,
            hooks.PeriodicWriter([CommonMetricPrinter(MAX_ITER)], period=PERIOD) if IS_MAIN else None,
        ]
    )
    checkpointer.resume_or_load("", resume=resume)
    start_iter = trainer.iter + 1 if resume and checkpointer.has_checkpoint() else 0
    trainer.train(start_iter, MAX_ITER)
    return trainer, start_iter


def main() -> None:
    out = Path(sys.argv[1])
    full, _ = run(out / "full")
    try:
        run(out / "part", crash=True)
    except RuntimeError as exc:
        crashed = str(exc)
    resumed, start_iter = run(out / "part", resume=True)
    model = Net()
    odd = SimpleTrainer(model, DataLoader(tiny_dataset(64), batch_size=16), torch.optim.SGD(model.parameters(), lr=0.1))
    every = PERIOD if IS_MAIN else PERIOD + 1  # a program whose ranks disagree on the saves
    odd.register_hooks([hooks.PeriodicCheckpointer(DetectionCheckpointer(model, str(out / "odd"), trainer=odd), every)])
    try:
        odd.train(0, 2)
    except TrainerError as exc:
        mismatch = str(exc)
    storage = full.storage
    from ember.compat.detectron2.utils import comm  # detectron2's collectives, inside the job

    rank = comm.get_rank()
    reduced = comm.reduce_dict({"loss": torch.tensor(float(rank + 1))})
    comm_seen = {"world": comm.get_world_size(), "rank": rank, "local_rank": comm.get_local_rank(),
                 "main": comm.is_main_process(), "all_gather": comm.all_gather({"rank": rank}),
                 "gather": comm.gather(rank * 10), "reduced": float(reduced["loss"]),
                 "seed": comm.shared_random_seed()}  # fmt: skip
    report(
        {
            "world": full.engine.data_parallel_size,
            "batches_per_epoch": len(full.data_loader),
            "crashed": crashed,
            "start_iter": start_iter,
            "resumed_equal": all(
                torch.equal(a, b) for a, b in zip(full.model.parameters(), resumed.model.parameters(), strict=True)
            ),
            "params": [p.detach().sum().item() for p in full.model.parameters()],
            "total_loss": storage.history("total_loss").values(),
            "resumed_loss": resumed.storage.history("total_loss").values(),
            "accuracy": storage.history("accuracy").values(),
            "lr": [lr for lr, _ in storage.history("lr").values()],
            "files": sorted(p.name for p in (out / "full").glob("*.ckpt")),
            "mismatch": mismatch,
            "comm": comm_seen,
        }
    )


if __name__ == "__main__":
    main()
