"""The training job of the sharded-checkpoint tests, the same in pytest (one process) and under torchrun.

A two-block GPT on 96 samples of 4 tokens, a global batch of 16 (6 updates per epoch, 2 epochs),
SGD with momentum, gradient clipping at 0.6, a step LR schedule and the loss metric. Launched
with ``zero=dict(stage=3)`` (``ZERO3``): FSDP2 on 2 or 4 processes, the plain model on one.
``FSDP_TP`` is 2 × 2 FSDP × tensor parallel on 4 (as a per-Engine config in a 4-process
``ZERO3`` launch). The per-rank batch is the global batch over the
data-parallel size, so every layout trains on the same global batches.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

import ember
from ember.checkpoint.export import full_model_state
from ember.parallel import plans
from ember.trainer import Trainer, hooks
from tests.parallel.common import dataset, global_mean, sgd, tiny_gpt

GLOBAL, N, EPOCHS = 16, 96, 2
ZERO3: dict[str, Any] = {"zero": {"stage": 3}, "clip_grad_norm": 0.6}
FSDP_TP: dict[str, Any] = {
    **ZERO3,
    "parallel": {"data": 2, "tensor": {"size": 2, "plan": plans.gpt_block(prefix="blocks.*")}},
}


class StepLosses(hooks.BaseHook):
    """The global batch's loss at every optimizer update (mean over the ranks: tensor-parallel
    ranks hold equal values), keyed by ``cur_step``."""

    def __init__(self) -> None:
        super().__init__(name="StepLosses")
        self.losses: dict[int, float] = {}

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        self.losses[self.trainer.cur_step] = global_mean(loss)


def build(config: dict[str, Any], logger: Any = None) -> tuple[Trainer, Any]:
    """The trainer and its training loader for ``config`` (the same initial weights everywhere)."""
    model = tiny_gpt(0)
    batch = GLOBAL // config.get("parallel", {}).get("data", ember.distributed.world_size())
    loader = ember.get_dataloader(dataset(N, tokens=4), shuffle=True, batch_size=batch, seed=0)
    engine, loader, _, _ = ember.initialize(model, sgd(model), nn.CrossEntropyLoss(), loader, config=config)
    return Trainer(engine, logger=logger), loader


def fit(
    config: dict[str, Any],
    ckpt: hooks.CheckpointHook | None = None,
    resume: Any = None,
    max_steps: int | None = None,
    logger: Any = None,
) -> tuple[Trainer, dict[str, torch.Tensor] | None, dict[int, float]]:
    """Train; return the trainer, the full weights (on rank 0, else None) and the per-update losses."""
    trainer, loader = build(config, logger)
    sched = torch.optim.lr_scheduler.StepLR(trainer.engine.optimizer, step_size=5, gamma=0.5)
    recorder = StepLosses()
    extra = [ckpt] if ckpt is not None else []
    hook_list = [hooks.LossHook(), hooks.LRSchedulerHook(sched, by_epoch=False), recorder, *extra]
    trainer.fit(loader, epochs=EPOCHS, max_steps=max_steps, hooks=hook_list, resume=resume)
    weights = full_model_state(trainer.engine)  # a collective: gathered onto rank 0
    return trainer, (weights if ember.distributed.rank() == 0 else None), recorder.losses


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between two full state dicts with the same keys."""
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def loss_diff(a: dict[int, float], b: dict[int, float]) -> float:
    """Largest difference between two runs' losses at the updates ``a`` has (``b`` must have them)."""
    return max(abs(v - b[int(k)]) for k, v in a.items())


def save_reference(out: Path, weights: dict[str, torch.Tensor], losses: dict[int, float]) -> None:
    torch.save(weights, out / "reference.pt")
    (out / "reference.json").write_text(json.dumps(losses))


def load_reference(out: Path) -> tuple[dict[str, torch.Tensor], dict[int, float]]:
    losses = {int(k): v for k, v in json.loads((out / "reference.json").read_text()).items()}
    return torch.load(out / "reference.pt"), losses
