"""The Colossal-AI tutorial's Engine loop, with ember names: train a CNN on digits, print loss and accuracy.

Run: python examples/engine_loop.py            (or torchrun --nproc_per_node 2 examples/engine_loop.py)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch import nn

import ember

sys.path.insert(0, str(Path(__file__).parent))
from digits import DigitsCNN, digits_datasets


def main() -> None:
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

    for epoch in range(cfg.NUM_EPOCHS):
        engine.train()
        train_dl.sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for x, y in train_dl:
            x, y = x.to(engine.device), y.to(engine.device)
            engine.zero_grad()
            out = engine(x)
            loss = engine.criterion(out, y)
            engine.backward(loss)
            engine.step()
            total, batches = total + loss.item(), batches + 1
        lr_scheduler.step()

        engine.eval()
        correct = seen = 0
        test_loss = 0.0
        with torch.no_grad():
            for x, y in test_dl:
                x, y = x.to(engine.device), y.to(engine.device)
                out = engine(x)
                test_loss += engine.criterion(out, y).item() * len(y)
                correct += (out.argmax(1) == y).sum().item()
                seen += len(y)
        logger.info(
            f"epoch {epoch + 1}/{cfg.NUM_EPOCHS}  train loss {total / batches:.4f}  "
            f"test loss {test_loss / seen:.4f}  test acc {correct / seen:.2%}",
            ranks=[0],
        )


if __name__ == "__main__":
    main()
