"""The training jobs of the 2-D / 2.5-D / 3-D (and 1-D layer) tests, in one process and under torchrun.

:func:`reference` trains the tiny ViT of :mod:`tests.parallel.vit` built from torch's modules;
:func:`engine_run` trains the same model built from a grid's layers through the Engine loop,
with a per-Engine ``parallel`` config, on the same global batches; :func:`fit` trains it with
the Trainer (a step LR schedule, clipping) and an optional ``CheckpointHook`` or resume. Each
starts from the same weights (the reference's, loaded into the grid layers), SGD with momentum.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

import ember
from ember.checkpoint.export import full_model_state
from ember.layout import ParallelLayout
from ember.parallel.grid import grid_of
from ember.parallel.layers import layers_for
from ember.trainer import Trainer, hooks
from tests.parallel.common import global_mean, run_engine
from tests.parallel.vit import ViT, images

GLOBAL, SAMPLES, LR = 8, 32, 0.1


def initial() -> dict[str, torch.Tensor]:
    """The weights every run starts from."""
    torch.manual_seed(0)
    return ViT(layers_for(None)).state_dict()


@functools.cache
def reference(steps: int = 4, clip: float | None = 0.5, accumulation: int = 1, schedule: bool = True) -> dict[str, Any]:
    """One process, plain PyTorch: ``steps`` updates, each on ``accumulation`` batches of
    :data:`GLOBAL`; clipping at ``clip``, a StepLR (halving every 2 updates) when ``schedule``."""
    assert steps * accumulation * GLOBAL <= SAMPLES * 2, "the loaders hold 2 epochs of samples"
    model = ViT(layers_for(None))
    model.load_state_dict(initial())
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5 if schedule else 1.0)
    losses, norms, cycle, correct = [], [], [], []
    for x, y in DataLoader(images(SAMPLES * 2), batch_size=GLOBAL):
        out = model(x)
        correct.append(int((out.argmax(dim=-1) == y).sum()))
        loss = nn.functional.cross_entropy(out, y)
        (loss / accumulation).backward()
        cycle.append(loss.item())
        if len(cycle) < accumulation:
            continue
        if clip is not None:
            norms.append(nn.utils.clip_grad_norm_(model.parameters(), clip).item())
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(sum(cycle) / accumulation)
        cycle = []
        if len(losses) == steps:
            break
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "losses": losses, "norms": norms,
            "correct": correct}  # fmt: skip


def build(
    parallel: dict[str, Any] | None, more: dict[str, Any] | None = None, samples: int = SAMPLES * 2,
    shuffle: bool = False,
) -> tuple[Any, Any, DataLoader[Any], Any]:  # fmt: skip
    """The grid ViT (from :func:`initial`), its Engine for the per-Engine ``parallel`` config (None:
    the one-process ViT of torch's modules), a loader of ``samples`` images in global batches split
    over the Engine's data replicas (``initialize`` shards it), and a StepLR over its optimizer."""
    layout = ParallelLayout.from_config(parallel, ember.distributed.world_size())
    L = layers_for(grid_of(layout) if parallel is not None else None)
    model = ViT(L)
    model.load_state_dict(initial())
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    loader = ember.get_dataloader(images(samples), shuffle=shuffle, batch_size=GLOBAL // layout.data, seed=0)
    config = {"parallel": parallel or {}, "zero": None, "amp": None, "clip_grad_norm": 0.5, **(more or {})}
    engine, loader, _, _ = ember.initialize(model, opt, L.CrossEntropyLoss(), loader, config=config)
    sched = torch.optim.lr_scheduler.StepLR(engine.optimizer, step_size=2, gamma=0.5)
    return engine, L, loader, sched


def engine_run(parallel: dict[str, Any], out: Path, name: str, steps: int = 4, **more: Any) -> dict[str, Any]:
    """The Engine loop: ``{name}.losses``, ``.norms`` (per update, global batch) and ``.policy`` on
    every rank; rank 0 saves the whole model and optimizer state to ``out/{name}.pt``."""
    engine, _, loader, sched = build(parallel, more)
    run = run_engine(engine, loader, steps, sched)
    save_state(engine.state_dict(), out / f"{name}.pt")
    return {f"{name}.losses": run["losses"], f"{name}.norms": run["norms"], f"{name}.policy": engine.parallel.name}


def save_state(state: dict[str, Any], path: Path) -> None:
    """Rank 0's whole model and optimizer state, for the test to compare with one process."""
    if ember.distributed.rank() == 0:
        torch.save({"model": state["model"], "optimizer": state["optimizer"]}, path)


class StepLosses(hooks.BaseHook):
    """The global batch's loss at every update, keyed by ``cur_step``."""

    def __init__(self) -> None:
        super().__init__(name="StepLosses")
        self.losses: dict[int, float] = {}

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        self.losses[self.trainer.cur_step] = global_mean(loss)


def fit(
    parallel: dict[str, Any] | None,
    ckpt: hooks.CheckpointHook | None = None,
    resume: Any = None,
    max_steps: int | None = None,
) -> tuple[dict[str, torch.Tensor] | None, dict[int, float], str]:
    """Trainer.fit for one epoch of :data:`SAMPLES` (4 updates); the whole weights (rank 0, else
    None), the per-update losses and the policy's name."""
    engine, _, loader, sched = build(parallel, samples=SAMPLES, shuffle=True)
    recorder = StepLosses()
    hook_list = [hooks.LossHook(), hooks.LRSchedulerHook(sched, by_epoch=False), recorder, *([ckpt] if ckpt else [])]
    Trainer(engine).fit(loader, epochs=1, max_steps=max_steps, hooks=hook_list, resume=resume)
    weights = full_model_state(engine)
    return (weights if ember.distributed.rank() == 0 else None), recorder.losses, engine.parallel.name
