"""One small training job, started by every launcher the multi-node tests exercise.

Usage: ``job.py OUT [--launcher torch|slurm|openmpi] [--port P] [--seed S] [--epochs E]
[--ckpt DIR] [--pause-at STEP] [--set key=value ...]``

A 3-layer MLP with dropout on a fixed synthetic 10-class problem, DDP over gloo,
``deterministic=True``, SGD with momentum whose learning rate halves each epoch, a Trainer with
loss, test accuracy, a CheckpointHook every 12 updates and at each epoch's end
(``resume=None``: ``ember run --max-restarts`` resumes through ``EMBER_RESUME=auto``) and a
TrackingHook. Each rank writes ``OUT/rank<R>.json``: its per-update
losses, the final parameters, the final test accuracy, the world size, the restart count and
where it resumed from. A rank of a node whose environment has ``EMBER_TEST_PAUSE`` set waits
after update STEP, in its first life only (``OUT/paused`` is the marker), until it is killed or
its agent stops it (SIGTERM: then ember's preemption saves a checkpoint).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

import ember
from ember.trainer import Trainer, hooks
from ember.trainer.hooks.base import BaseHook

torch.set_num_threads(1)


def datasets() -> tuple[TensorDataset, TensorDataset]:
    """10 overlapping Gaussian classes in 16 dimensions, 960 to train on and 2,880 to test on."""
    g = torch.Generator().manual_seed(1234)
    centres = torch.randn(10, 16, generator=g) * 0.8
    labels = torch.randint(0, 10, (3840,), generator=g)
    x = centres[labels] + torch.randn(3840, 16, generator=g)
    return TensorDataset(x[:960], labels[:960]), TensorDataset(x[960:], labels[960:])


class StepLosses(BaseHook):
    """Record this rank's loss at every optimizer update."""

    def __init__(self) -> None:
        super().__init__(name="StepLosses")
        self.losses: dict[int, float] = {}

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        if self.trainer.step_applied:
            self.losses[self.trainer.cur_step] = float(loss.detach())


class PauseOnce(BaseHook):
    """Wait after update ``step`` on a node with ``EMBER_TEST_PAUSE`` set, the first time only."""

    def __init__(self, step: int, marker: Path) -> None:
        super().__init__(name="PauseOnce")
        self.step, self.marker = step, marker

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        due = self.step and self.trainer.step_applied and self.trainer.cur_step == self.step
        if not due or not os.environ.get("EMBER_TEST_PAUSE") or self.marker.exists():
            return
        stopped = []
        previous = signal.getsignal(signal.SIGTERM)

        def on_term(signum: int, frame: Any) -> None:  # the agent stops us: let ember's handler save
            stopped.append(signum)
            if callable(previous):
                previous(signum, frame)

        signal.signal(signal.SIGTERM, on_term)
        self.marker.write_text(json.dumps({"rank": ember.context.rank, "pid": os.getpid()}))
        try:
            deadline = time.monotonic() + 120
            while not stopped and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            signal.signal(signal.SIGTERM, previous)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--launcher", default="torch", choices=["torch", "slurm", "openmpi"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--ckpt", default="ckpt")
    p.add_argument("--pause-at", type=int, default=0)
    p.add_argument("--set", nargs="*", default=[], help="config overrides")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    config = {"seed": args.seed, "deterministic": True}
    if args.launcher == "torch":
        ember.launch_from_torch(config=config, overrides=args.set, verbose=False)
    elif args.launcher == "slurm":
        ember.launch_from_slurm(config, host=args.host, port=args.port, verbose=False)
    else:
        ember.launch_from_openmpi(config, host=args.host, port=args.port, verbose=False)

    train, test = datasets()
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 10))  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    engine, train_dl, test_dl, _ = ember.initialize(
        model,
        optimizer,
        nn.CrossEntropyLoss(),
        ember.get_dataloader(train, shuffle=True, batch_size=16),
        ember.get_dataloader(test, batch_size=480),
    )
    ckpt = hooks.CheckpointHook(args.ckpt, every_n_steps=12, every_n_epochs=1, keep_last=None)
    steps = StepLosses()
    trainer = Trainer(engine)
    trainer.fit(
        train_dl,
        epochs=args.epochs,
        test_dataloader=test_dl,
        hooks=[hooks.LossHook(), hooks.AccuracyHook(), ckpt, steps, PauseOnce(args.pause_at, args.out / "paused"),
               hooks.LRSchedulerHook(torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5), by_epoch=True),
               hooks.TrackingHook(name="multinode", system_interval_s=None)],
    )  # fmt: skip
    ctx = ember.context
    report = {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "host": socket.gethostname(),
        "cwd": os.getcwd(),
        "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "resumed_from": None if ckpt.resumed_from is None else ckpt.resumed_from.name,
        "losses": steps.losses,
        "accuracy": trainer.history.latest("test/accuracy"),
        "steps": trainer.cur_step,
        "params": [v.flatten().tolist() for v in engine.model.state_dict().values()] if ctx.rank == 0 else None,
    }
    (args.out / f"rank{ctx.rank}.json").write_text(json.dumps(report))
    print(f"rank {ctx.rank}: accuracy {report['accuracy']:.4f} after {trainer.cur_step} updates", file=sys.stderr)


if __name__ == "__main__":
    main()
