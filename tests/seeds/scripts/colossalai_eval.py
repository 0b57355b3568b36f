"""The Colossal-AI install write-up's eval.py, imports rewritten: a Config object, the Engine loop.

Written afresh following the write-up: ``colossalai`` -> ``ember.compat.colossalai``, CIFAR10
and resnet34 from the stand-ins (no ``DATA`` directory), no ``.cuda()`` calls; the write-up runs
it on one GPU, the test under ``torchrun --nproc_per_node 2``. Saving and loading
``engine.model``'s state dict follows the write-up's table of Engine methods. What the test
checks is reported at the end.
"""

import os
import tempfile

import torch
from colossalai_standins import CIFAR10, resnet34
from tqdm import tqdm

import ember.compat.colossalai as colossalai
from ember.compat.colossalai.amp import AMP_TYPE
from ember.compat.colossalai.context import Config
from ember.compat.colossalai.core import global_context as gpc
from ember.compat.colossalai.logging import get_dist_logger
from ember.compat.colossalai.nn.lr_scheduler import CosineAnnealingLR
from ember.compat.colossalai.utils import get_dataloader

global_config = Config({
    "BATCH_SIZE": 32,
    "NUM_EPOCHS": 3,
    "CONFIG": {
        "fp16": {
            "mode": AMP_TYPE.TORCH
        }
    }
})  # fmt: skip


def main():
    colossalai.launch_from_torch(config=global_config)

    logger = get_dist_logger()

    model = resnet34(num_classes=10)

    print("loading dataset...")
    train_dataset = CIFAR10(root=os.environ.get("DATA", "./data"), download=True)
    print("finish loading dataset...")
    test_dataset = CIFAR10(root=os.environ.get("DATA", "./data"), train=False)

    train_dataloader = get_dataloader(dataset=train_dataset,
                                      shuffle=True,
                                      batch_size=gpc.config.BATCH_SIZE,
                                      num_workers=1,
                                      pin_memory=True,
                                      )  # fmt: skip
    test_dataloader = get_dataloader(dataset=test_dataset,
                                     add_sampler=False,
                                     batch_size=gpc.config.BATCH_SIZE,
                                     num_workers=1,
                                     pin_memory=True,
                                     )  # fmt: skip

    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    lr_scheduler = CosineAnnealingLR(optimizer, total_steps=gpc.config.NUM_EPOCHS)

    engine, train_dataloader, test_dataloader, _ = colossalai.initialize(model,
                                                                         optimizer,
                                                                         criterion,
                                                                         train_dataloader,
                                                                         test_dataloader,
                                                                         )  # fmt: skip

    seen = []  # test instrumentation
    for epoch in range(gpc.config.NUM_EPOCHS):
        engine.train()
        used_lr = engine.optimizer.param_groups[0]["lr"]
        if gpc.get_global_rank() == 0:  # noqa: SIM108 - as the write-up has it
            train_dl = tqdm(train_dataloader)
        else:
            train_dl = train_dataloader
        for img, label in train_dl:
            engine.zero_grad()
            output = engine(img)
            train_loss = engine.criterion(output, label)
            engine.backward(train_loss)
            engine.step()
        lr_scheduler.step()

        engine.eval()
        correct = 0
        total = 0
        for img, label in test_dataloader:
            with torch.no_grad():
                output = engine(img)
                test_loss = engine.criterion(output, label)
            pred = torch.argmax(output, dim=-1)
            correct += torch.sum(pred == label)
            total += img.size(0)

        logger.info(
            f"Epoch {epoch} - train loss: {train_loss:.5}, test loss: {test_loss:.5}, acc: {correct / total:.5}, "
            f"lr: {lr_scheduler.get_last_lr()[0]:.5g}",
            ranks=[0],
        )
        seen.append({"lr_used": used_lr, "lr_after": lr_scheduler.get_last_lr()[0], "acc": float(correct / total),
                     "total": total})  # fmt: skip

    # the write-up's table: save and load the model through engine.model
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.pt")
        torch.save(engine.model.state_dict(), f=path)
        fresh = resnet34(num_classes=10)
        fresh.load_state_dict(torch.load(f=path))  # the keys are the plain model's
        engine.model.load_state_dict(torch.load(f=path))
        with torch.no_grad():
            x = test_dataset.data[:8]
            same = bool(torch.equal(fresh(x), engine.model(x)))

    from tests.dist import report

    report({"epochs": seen, "amp": gpc.config.amp, "nested": gpc.config.CONFIG.fp16.mode.value,
            "reloaded_equal": same, "keys": sorted(engine.model.state_dict())})  # fmt: skip


if __name__ == "__main__":
    main()
