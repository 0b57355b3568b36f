"""One small pytorch-accelerated training run, for comparing ember's compat with the real library.

``python pta_same_run.py pytorch_accelerated`` runs it on the real pytorch-accelerated (from
PyPI), ``... ember.compat.pytorch_accelerated`` on ember: the same program, its import rewritten.
It prints one JSON line: the run history's epoch losses, the final parameters and learning rate.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset


def run(package: str, shuffle: bool = False) -> dict[str, Any]:
    """Train 3 epochs with a warm-up + cosine schedule and evaluation; what the run recorded."""
    trainer_cls = importlib.import_module(package).Trainer
    cosine = importlib.import_module(f"{package}.schedulers").CosineLrScheduler
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 8, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    xe = torch.randn(16, 8, generator=g)
    ye = (xe[:, 0] > 0).long()
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    trainer = trainer_cls(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                          callbacks=())  # fmt: skip
    trainer.train(
        train_dataset=TensorDataset(x, y), eval_dataset=TensorDataset(xe, ye), num_epochs=3, per_device_batch_size=8,
        train_dataloader_kwargs={"shuffle": shuffle, "num_workers": 0}, eval_dataloader_kwargs={"num_workers": 0},
        create_scheduler_fn=cosine.create_scheduler_fn(num_warmup_epochs=1, warmup_starting_lr=0.01),
    )  # fmt: skip
    history = trainer.run_history
    return {
        "train_loss_epoch": [float(v) for v in history.get_metric_values("train_loss_epoch")],
        "eval_loss_epoch": [float(v) for v in history.get_metric_values("eval_loss_epoch")],
        "params": [p.detach().double().flatten().tolist() for p in trainer.get_model().parameters()],
        "lr": trainer.optimizer.param_groups[0]["lr"],
    }


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], shuffle=len(sys.argv) > 2 and sys.argv[2] == "shuffle")))
