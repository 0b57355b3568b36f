"""pytorch-accelerated's transfer-learning example, with only its imports rewritten to ember.compat.

The ants/bees ImageFolder and the pretrained ResNet-18 are stand-ins (tests/seeds/pa_standins.py);
the rest follows the example. ``--num_epochs`` (1 in the example) lets the test see the StepLR,
stepped per update with ``step_size = NUM_UPDATE_STEPS_PER_EPOCH * 7``, decay after 7 epochs.
Run as a script (one process) or under torchrun (no launch call: the Trainer joins the group),
on a folder made by ``pa_standins.make_image_folder``.
"""

from __future__ import annotations

import argparse
import os
from functools import partial

import torch
from tests.dist import report
from tests.seeds.pa_standins import ImageFolder, resize, resnet18
from torch import nn, optim
from torch.optim import lr_scheduler
from torch.utils.data import TensorDataset

from ember.compat.pytorch_accelerated.finetuning import ModelFreezer
from ember.compat.pytorch_accelerated.trainer import Trainer, TrainerPlaceholderValues


def main(data_dir: str, num_epochs: int) -> Trainer:
    data_transforms = {"train": resize(16), "val": resize(16)}
    image_datasets = {x: ImageFolder(os.path.join(data_dir, x), data_transforms[x]) for x in ["train", "val"]}
    model = resnet18(pretrained=True)
    model.fc = nn.Linear(model.fc.in_features, len(image_datasets["train"].classes))
    loss_func = nn.CrossEntropyLoss()
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    exp_lr_scheduler = partial(
        lr_scheduler.StepLR,
        step_size=TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH * 7,
        gamma=0.1,
    )
    trainer = Trainer(model, loss_func=loss_func, optimizer=optimizer)
    trainer.train(
        train_dataset=image_datasets["train"],
        eval_dataset=image_datasets["val"],
        num_epochs=num_epochs,
        per_device_batch_size=4,
        create_scheduler_fn=exp_lr_scheduler,
    )
    return trainer


def unfreeze_between_train_calls() -> list[float]:
    """pets_finetune's pattern on a small model: train the head with the body frozen, then
    ``ModelFreezer.unfreeze``, add the body to the optimizer and train on; the weights after."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    freezer = ModelFreezer(model)
    freezer.freeze()
    optimizer = optim.SGD(freezer.get_trainable_parameters(), lr=0.1)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    g = torch.Generator().manual_seed(rank)  # each process's data differs, so unsynced replicas drift
    data = TensorDataset(torch.randn(16, 4, generator=g), torch.randint(0, 2, (16,), generator=g))
    trainer = Trainer(model, loss_func=nn.CrossEntropyLoss(), optimizer=optimizer, callbacks=[])
    quiet = {"num_workers": 0}
    trainer.train(train_dataset=data, num_epochs=1, per_device_batch_size=4, train_dataloader_kwargs=quiet)
    for group in freezer.unfreeze().values():
        optimizer.add_param_group(group)
    trainer.train(train_dataset=data, num_epochs=1, per_device_batch_size=4, train_dataloader_kwargs=quiet)
    return [p.detach().sum().item() for p in model.parameters()]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Simple example of training script.")
    parser.add_argument("--data_dir", required=True, help="The data folder on disk.")
    parser.add_argument("--num_epochs", type=int, default=1)
    args = parser.parse_args()
    trainer = main(args.data_dir, args.num_epochs)
    val = ImageFolder(os.path.join(args.data_dir, "val"), resize(16))
    x = torch.stack([val[i][0] for i in range(len(val))])
    y = torch.tensor([val[i][1] for i in range(len(val))])
    trainer.model.eval()
    with torch.no_grad():
        accuracy = (trainer.model(x).argmax(1) == y).float().mean().item()
    history = trainer.run_history
    report(
        {
            "world": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
            "metrics": {
                k: list(trainer.run_history.get_metric_values(k)) for k in trainer.run_history.get_metric_names()
            },
            "current_epoch": trainer.run_history.current_epoch,
            "step_size": trainer.scheduler.step_size,
            "updates_per_epoch": trainer.run_config.num_update_steps_per_epoch,
            "local_updates_per_epoch": trainer.run_config.num_local_update_steps_per_epoch,
            "lr": trainer.optimizer.param_groups[0]["lr"],
            "scheduler_steps": trainer.scheduler.last_epoch,
            "accuracy": accuracy,
            "gathered": trainer.gather(torch.tensor([float(os.environ.get("RANK", "0"))])).tolist(),
            "params": [p.detach().sum().item() for p in trainer.model.parameters()],
            "unfrozen_params": unfreeze_between_train_calls(),
        }
    )
