"""pytorch-accelerated's progressive-resizing example, with only its imports rewritten to ember.compat.

Imagenette, timm's ResNet-50d and torchvision's transforms are stand-ins
(tests/seeds/pa_standins.py), at image sizes 8/12/16 instead of 64/128/224; torchmetrics'
``Accuracy`` takes ``task=`` since torchmetrics 0.11. The rest follows the example: a metric
callback, early stopping, save-best, and three ``train`` calls that continue one run history
with a OneCycleLR sized by placeholders.
"""

from __future__ import annotations

import argparse
import os
from collections import namedtuple
from functools import partial
from pathlib import Path

import torch
from tests.seeds.pa_standins import ImageFolder, create_model, resize
from torch import nn
from torch.optim.lr_scheduler import OneCycleLR
from torchmetrics import Accuracy

from ember.compat.pytorch_accelerated.callbacks import (
    EarlyStoppingCallback,
    LogMetricsCallback,
    PrintProgressCallback,
    ProgressBarCallback,
    SaveBestModelCallback,
    TerminateOnNaNCallback,
    TrainerCallback,
)
from ember.compat.pytorch_accelerated.trainer import Trainer, TrainerPlaceholderValues


class AccuracyCallback(TrainerCallback):
    def __init__(self, num_classes):
        self.accuracy = Accuracy(task="multiclass", num_classes=num_classes)

    def on_training_run_start(self, trainer, **kwargs):
        self.accuracy.to(trainer._eval_dataloader.device)

    def on_eval_step_end(self, trainer, batch, batch_output, **kwargs):
        preds = batch_output["model_outputs"].argmax(dim=-1)
        self.accuracy.update(preds, batch[1])

    def on_eval_epoch_end(self, trainer, **kwargs):
        trainer.run_history.update_metric("accuracy", self.accuracy.compute().item())
        self.accuracy.reset()


def create_transforms(train_image_size=224, val_image_size=224):
    return {"train": resize(train_image_size), "val": resize(val_image_size)}


def main(data_dir):
    data_dir = Path(data_dir)
    num_classes = len(list((data_dir / "train").iterdir()))

    model = create_model("resnet50d", pretrained=False, num_classes=num_classes)
    loss_func = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(params=model.parameters(), lr=0.01 / 25)

    trainer = Trainer(
        model,
        loss_func=loss_func,
        optimizer=optimizer,
        callbacks=(
            TerminateOnNaNCallback,
            AccuracyCallback(num_classes=num_classes),
            PrintProgressCallback,
            ProgressBarCallback,
            LogMetricsCallback,
            EarlyStoppingCallback(early_stopping_patience=2),
            SaveBestModelCallback(watch_metric="accuracy", greater_is_better=True),
        ),
    )

    EpochConfig = namedtuple("EpochConfig", ["num_epochs", "train_image_size", "eval_image_size", "lr"])
    epoch_configs = [
        EpochConfig(num_epochs=2, train_image_size=8, eval_image_size=8, lr=0.01),
        EpochConfig(num_epochs=3, train_image_size=12, eval_image_size=12, lr=0.01),
        EpochConfig(num_epochs=6, train_image_size=16, eval_image_size=16, lr=0.001),
    ]

    for e_config in epoch_configs:
        trainer.print(f"Training with image size: {e_config.train_image_size}")
        image_datasets = {
            x: ImageFolder(
                os.path.join(data_dir, x),
                create_transforms(train_image_size=e_config.train_image_size, val_image_size=e_config.eval_image_size)[
                    x
                ],
            )
            for x in ["train", "val"]
        }
        lr_scheduler = partial(
            OneCycleLR,
            max_lr=e_config.lr,
            epochs=TrainerPlaceholderValues.NUM_EPOCHS,
            steps_per_epoch=TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH,
        )
        trainer.train(
            train_dataset=image_datasets["train"],
            eval_dataset=image_datasets["val"],
            num_epochs=e_config.num_epochs,
            create_scheduler_fn=lr_scheduler,
            per_device_batch_size=32,
            reset_run_history=False,
        )
    return trainer


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Simple example of training script.")
    parser.add_argument("--data_dir", required=True, help="The data folder on disk.")
    args = parser.parse_args()
    main(args.data_dir)
