"""pytorch-accelerated's progressive-resizing example with ember's names: three fits at growing image sizes.

Digits are upsampled to 12, 16 and 24 pixels; the same model (adaptive pooling) keeps training,
and each ``fit`` continues the counters and the metric history of the one before
(``reset_run_history=False``, the default, spelt out as pytorch-accelerated's example does).

Run: python examples/progressive_resizing.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

from ember.logging import setup_output
from ember.trainer import Trainer, hooks

sys.path.insert(0, str(Path(__file__).parent))
from digits import DigitsCNN, digits_datasets


def main() -> int:
    setup_output()  # ember's log lines on stderr: this script does not call ember.launch
    torch.manual_seed(0)
    model = DigitsCNN()
    trainer = Trainer(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                      criterion=nn.CrossEntropyLoss())  # fmt: skip
    schedule = ((12, 4), (16, 3), (24, 3))
    for size, epochs in schedule:
        train_ds, test_ds = digits_datasets(size=size)
        trainer.fit(
            train_dataset=train_ds, test_dataset=test_ds, batch_size=32, epochs=epochs, reset_run_history=False,
            hooks=[hooks.LossHook(), hooks.AccuracyHook(), hooks.LogMetricByEpochHook()],
        )  # fmt: skip
        print(
            f"size {size}: {trainer.cur_epoch} epochs in total, test acc {trainer.history.latest('test/accuracy'):.2%}"
        )
    epochs_logged = trainer.history.epochs("test/accuracy")
    print(f"history spans epochs {epochs_logged[0]}..{epochs_logged[-1]}")
    total = sum(epochs for _, epochs in schedule)
    return 0 if epochs_logged == list(range(total)) and trainer.history.latest("test/accuracy") >= 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
