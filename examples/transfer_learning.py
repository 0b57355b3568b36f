"""pytorch-accelerated's transfer-learning example, with ember's native names.

A "pretrained-like" backbone is first trained on digits 0-4; its features are then frozen and a
fresh head is fitted on digits 5-9. The scheduler is a StepLR whose step size is a placeholder
resolved when ``fit`` starts (two epochs' worth of optimizer updates), and the Trainer builds
the dataloaders itself from the datasets (``train_dataset=`` / ``batch_size=``).

Run: python examples/transfer_learning.py
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from ember.logging import setup_output
from ember.trainer import Placeholders, Trainer, hooks

sys.path.insert(0, str(Path(__file__).parent))
from digits import DigitsCNN, digits_datasets


def subset(ds: TensorDataset, classes: range) -> TensorDataset:
    """The samples of ``ds`` whose label is in ``classes``, relabelled from 0."""
    x, y = ds.tensors
    keep = (y >= classes.start) & (y < classes.stop)
    return TensorDataset(x[keep], y[keep] - classes.start)


def main() -> int:
    setup_output()  # ember's log lines on stderr: this script does not call ember.launch
    torch.manual_seed(0)
    train_ds, test_ds = digits_datasets()
    model = DigitsCNN(num_classes=5)

    # 1. "pretraining" on the first five digits
    pretrain = Trainer(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                       criterion=nn.CrossEntropyLoss())  # fmt: skip
    pretrain.fit(train_dataset=subset(train_ds, range(0, 5)), batch_size=32, epochs=4, hooks=[hooks.LossHook()])

    # 2. transfer: freeze the features, new head for the other five digits
    for p in model.features.parameters():
        p.requires_grad_(False)
    model.head[-1] = nn.Linear(model.head[-1].in_features, 5)
    optimizer = torch.optim.SGD(model.head.parameters(), lr=0.1, momentum=0.9)
    scheduler = partial(
        torch.optim.lr_scheduler.StepLR, step_size=Placeholders.NUM_UPDATE_STEPS_PER_EPOCH * 2, gamma=0.5
    )
    lr_hook = hooks.LRSchedulerHook(scheduler, by_epoch=False)

    trainer = Trainer(model=model, optimizer=optimizer, criterion=nn.CrossEntropyLoss())
    trainer.fit(
        train_dataset=subset(train_ds, range(5, 10)),
        test_dataset=subset(test_ds, range(5, 10)),
        batch_size=32,
        epochs=6,
        hooks=[hooks.LossHook(), hooks.AccuracyHook(), lr_hook, hooks.LogMetricByEpochHook()],
    )
    step_size = lr_hook.lr_scheduler.step_size
    accuracy = trainer.history.latest("test/accuracy")
    print(f"StepLR step_size resolved to {step_size}; transfer test acc {accuracy:.2%}")
    return 0 if accuracy >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
