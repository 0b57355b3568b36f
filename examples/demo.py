"""ember's main job: a small CNN on scikit-learn's digits, trained by the Trainer with hooks.

The Colossal-AI tutorial's hook list (loss, LR schedule by epoch, accuracy, per-epoch log, memory) with tqdm
progress bars, and the run recorded in the local tracking store (``ember runs ls`` lists it).
Exits 1 if the final test accuracy is below 95%.

Run: make demo                          (or: python examples/demo.py)
     torchrun --nproc_per_node 2 examples/demo.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch import nn

import ember
from ember.trainer import Trainer, hooks

sys.path.insert(0, str(Path(__file__).parent))
from digits import DigitsCNN, digits_datasets

TARGET = 0.95


def main() -> int:
    config = Path(__file__).with_name("config.py")
    if "RANK" in os.environ:
        ember.launch_from_torch(config=config)
    else:
        ember.launch(config=config)
    cfg = ember.config
    logger = ember.get_dist_logger()

    train_ds, test_ds = digits_datasets()
    train_dl = ember.get_dataloader(train_ds, shuffle=True, batch_size=cfg.BATCH_SIZE)
    test_dl = ember.get_dataloader(test_ds, batch_size=256)
    model = DigitsCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.LEARNING_RATE)
    lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=cfg.NUM_EPOCHS)
    engine, train_dl, test_dl, lr_scheduler = ember.initialize(
        model, optimizer, nn.CrossEntropyLoss(), train_dl, test_dl, lr_scheduler
    )

    trainer = Trainer(engine=engine, logger=logger)
    trainer.fit(
        train_dataloader=train_dl,
        epochs=cfg.NUM_EPOCHS,
        test_dataloader=test_dl,
        test_interval=1,
        display_progress=True,
        hooks=[
            hooks.LossHook(),
            hooks.LRSchedulerHook(lr_scheduler, by_epoch=True),
            hooks.AccuracyHook(),
            hooks.LogMetricByEpochHook(logger),
            hooks.LogMemoryByEpochHook(logger),
            hooks.TrackingHook(name="digits-demo", hparams={"lr": cfg.LEARNING_RATE}),
        ],
    )
    accuracy = trainer.history.latest("test/accuracy")
    logger.info(f"final test acc {accuracy:.2%} (target {TARGET:.0%})", ranks=[0])
    return 0 if accuracy >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
