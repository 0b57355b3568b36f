"""The Colossal-AI tutorial's run_resnet_cifar10_with_trainer.py (steps 1-4 and 6), imports rewritten.

Written afresh following the tutorial, with its custom ``LogMessageHook``: ``colossalai`` ->
``ember.compat.colossalai``, CIFAR10 and resnet34 from the stand-ins, no ``.cuda()`` calls.
Run by tests/seeds/test_colossalai.py under ``torchrun --nproc_per_node 2``. ``Probe`` and the
log capture are test instrumentation, not part of the program.
"""

import logging
from pathlib import Path

import torch
from colossalai_standins import CIFAR10, resnet34

import ember.compat.colossalai as colossalai
from ember.compat.colossalai.core import global_context as gpc
from ember.compat.colossalai.logging import get_dist_logger
from ember.compat.colossalai.nn.lr_scheduler import CosineAnnealingLR
from ember.compat.colossalai.nn.metric import Accuracy
from ember.compat.colossalai.trainer import Trainer, hooks
from ember.compat.colossalai.utils import get_dataloader


class LogMessageHook(hooks.BaseHook):
    def __init__(self, priority=10):
        self._logger = get_dist_logger()

    def before_train(self, trainer):
        self._logger.info("training starts")

    def after_train(self, trainer):
        self._logger.info("training finished")


# test instrumentation: every log record, and what each epoch used and measured on this rank
records = []
capture = logging.Handler()
capture.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
get_dist_logger().logger.addHandler(capture)


class Probe(hooks.BaseHook):
    def __init__(self, priority=50):
        super().__init__(priority)
        self.epochs = []

    def before_train_epoch(self, trainer):
        self.lr_used = trainer.engine.optimizer.param_groups[0]["lr"]

    def before_test_epoch(self, trainer):
        self.test_samples = 0

    def after_test_iter(self, trainer, output, label, loss):
        self.test_samples += len(label)

    def after_train_epoch(self, trainer):
        self.epochs.append({"lr_used": self.lr_used, "lr_after": lr_scheduler.get_last_lr()[0],
                            "test_samples": self.test_samples})  # fmt: skip


colossalai.launch_from_torch(config=str(Path(__file__).with_name("colossalai_config.py")))

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

engine, train_dataloader, test_dataloader, _ = colossalai.initialize(
    model,
    optimizer,
    criterion,
    train_dataloader,
    test_dataloader,
)

# step 6: train with the Trainer
trainer = Trainer(
    engine=engine,
    logger=logger,
)

hook_list = [
    hooks.LossHook(),
    hooks.LRSchedulerHook(lr_scheduler=lr_scheduler, by_epoch=True),
    hooks.AccuracyHook(accuracy_func=Accuracy()),
    hooks.LogMetricByEpochHook(logger),
    hooks.LogMemoryByEpochHook(logger),
]
hook_list.append(LogMessageHook())
probe = Probe()

trainer.fit(
    train_dataloader=train_dataloader,
    epochs=gpc.config.NUM_EPOCHS,
    test_dataloader=test_dataloader,
    test_interval=1,
    hooks=[*hook_list, probe],
    display_progress=True,
)

from tests.dist import report  # noqa: E402 - test instrumentation, after the program

report({
    "epochs": probe.epochs,
    "accuracy": trainer.history.values("test/accuracy"),
    "train_loss": trainer.history.values("train/loss"),
    "hooks": [[type(h).__name__, h.priority] for h in trainer.hooks],
    "custom_priority": hook_list[-1].priority,
    "messages": records,
    "cur_epoch": trainer.cur_epoch,
    "steps_per_epoch": trainer.steps_per_epoch,
})  # fmt: skip
