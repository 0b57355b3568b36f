"""The Colossal-AI tutorial's run_resnet_cifar10_with_engine.py (steps 1-5), imports rewritten.

Written afresh following the tutorial: ``colossalai`` -> ``ember.compat.colossalai``, CIFAR10
and resnet34 from the stand-ins, no ``.cuda()`` calls (CPU). Run by tests/seeds/test_colossalai.py
under ``torchrun --nproc_per_node 2``; what the test checks is reported at the end.
"""

from pathlib import Path

import torch
from colossalai_standins import CIFAR10, resnet34

import ember.compat.colossalai as colossalai
from ember.compat.colossalai.context import ParallelMode
from ember.compat.colossalai.core import global_context as gpc
from ember.compat.colossalai.logging import get_dist_logger
from ember.compat.colossalai.nn.lr_scheduler import CosineAnnealingLR
from ember.compat.colossalai.utils import get_dataloader

# step 2: the distributed environment, from the config file
colossalai.launch_from_torch(config=str(Path(__file__).with_name("colossalai_config.py")))

# step 3: the training components
logger = get_dist_logger()
model = resnet34(num_classes=10)
train_dataset = CIFAR10(root="./data", download=True)
test_dataset = CIFAR10(root="./data", train=False)

train_dataloader = get_dataloader(
    dataset=train_dataset,
    shuffle=True,
    batch_size=gpc.config.BATCH_SIZE,
    num_workers=1,
    pin_memory=True,
)
test_dataloader = get_dataloader(
    dataset=test_dataset,
    add_sampler=False,
    batch_size=gpc.config.BATCH_SIZE,
    num_workers=1,
    pin_memory=True,
)

criterion = torch.nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
lr_scheduler = CosineAnnealingLR(optimizer, total_steps=gpc.config.NUM_EPOCHS)

# step 4: the Engine
engine, train_dataloader, test_dataloader, _ = colossalai.initialize(
    model,
    optimizer,
    criterion,
    train_dataloader,
    test_dataloader,
)

# step 5: train with the Engine
seen = []  # test instrumentation: what each epoch used and measured on this rank
for epoch in range(gpc.config.NUM_EPOCHS):
    engine.train()
    used_lr = engine.optimizer.param_groups[0]["lr"]
    for img, label in train_dataloader:
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

from tests.dist import report  # noqa: E402 - test instrumentation, after the program

report({
    "epochs": seen,
    "rank": gpc.get_global_rank(),
    "world": gpc.get_world_size(ParallelMode.GLOBAL),
    "data_world": gpc.get_world_size(ParallelMode.DATA),
    "amp": gpc.config.amp,
    "train_batches": len(train_dataloader),
    "test_dataset": len(test_dataset),
})  # fmt: skip
