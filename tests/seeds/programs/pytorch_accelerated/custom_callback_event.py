# Vendored from pytorch_accelerated_examples (see README.md), rewritten by tests/peers/vendor.py: its imports only.
# Copyright © 2021 Chris Hughes
########################################################################
# This example trains a model on the MNIST Dataset and demonstrates using
# a custom callback event

# Note: this example requires installing the tests.seeds.standins.torchvision package
########################################################################

from pathlib import Path

from torch import nn, optim
from torch.utils.data import random_split
from tests.seeds.standins.torchvision import transforms
from tests.seeds.standins.torchvision.datasets import MNIST

from ember.compat.pytorch_accelerated.callbacks import (
    LogMetricsCallback,
    PrintProgressCallback,
    ProgressBarCallback,
    TerminateOnNaNCallback,
    TrainerCallback,
)
from ember.compat.pytorch_accelerated.trainer import Trainer


class MNISTModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Linear(in_features=784, out_features=128),
            nn.ReLU(),
            nn.Linear(in_features=128, out_features=64),
            nn.ReLU(),
            nn.Linear(in_features=64, out_features=10),
        )

    def forward(self, input):
        return self.main(input.view(input.shape[0], -1))


class VerifyBatchCallback(TrainerCallback):
    def verify_train_batch(self, trainer, xb, yb):
        assert xb.shape[0] == trainer.run_config.train_per_device_batch_size
        assert xb.shape[1] == 1
        assert xb.shape[2] == 28
        assert xb.shape[3] == 28
        assert yb.shape[0] == trainer.run_config.train_per_device_batch_size


class TrainerWithCustomCallbackEvent(Trainer):
    def calculate_train_batch_loss(self, batch) -> dict:
        xb, yb = batch
        self.callback_handler.call_event(
            "verify_train_batch", trainer=self, xb=xb, yb=yb
        )
        return super().calculate_train_batch_loss(batch)


DATA_PATH = Path("/".join(Path(__file__).absolute().parts[:-2])) / "data"


def main():
    dataset = MNIST(DATA_PATH, download=True, transform=transforms.ToTensor())
    train_dataset, validation_dataset = random_split(dataset, [55000, 5000])
    model = MNISTModel()
    optimizer = optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    loss_func = nn.CrossEntropyLoss()

    trainer = TrainerWithCustomCallbackEvent(
        model,
        loss_func=loss_func,
        optimizer=optimizer,
        callbacks=(
            VerifyBatchCallback,
            TerminateOnNaNCallback,
            PrintProgressCallback,
            ProgressBarCallback,
            LogMetricsCallback,
        ),
    )

    trainer.train(
        train_dataset=train_dataset,
        eval_dataset=validation_dataset,
        train_dataloader_kwargs={"drop_last": True},
        num_epochs=8,
        per_device_batch_size=32,
    )


if __name__ == "__main__":
    main()
