"""The 2-D, 2.5-D and 1-D-layer runs of the 4-process torchrun (``four_ranks.py`` calls :func:`grid_four`).

Each reports its per-update losses and norms, and rank 0 saves its whole final state into the
output folder (``EMBER_GRID_OUT``): the test compares them with one process.

* the Engine loop: ``2d4`` (2 × 2), ``2.5d4`` (depth 1 × 2 × 2), ``1d`` (Colossal-AI's 1-D
  layers, tensor 2 × data 2);
* ``convert``: the plain ``TinyGPT`` (nn.Linear / nn.LayerNorm layers, no plan) under 2-D, its
  layers placed by ember;
* ``ckpt2d``: a 2-D Trainer run saving sharded checkpoints into ``OUT/2d``, resumed from update 2
  on 2-D (bit-identical) and on the 1-D layers with 2 data replicas (the same model resharded
  by DCP, within 1e-6).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tests.parallel import grid_jobs
from tests.parallel.common import dataset, max_diff, run_engine, sgd, tiny_gpt
from torch import nn

import ember
from ember.trainer import hooks

TWO_D = {"data": 1, "tensor": {"size": 4, "mode": "2d", "plan": None}}
TWO_P5_D = {"data": 1, "tensor": {"size": 4, "mode": "2.5d", "depth": 1, "plan": None}}
ONE_D = {"data": 2, "tensor": {"size": 2, "mode": "1d", "plan": None}}
CONVERT = {"samples": 64, "batch": 16, "steps": 4, "clip": 0.6}
"""The converted TinyGPT's run (the test's one-process reference takes the same)."""


def convert(out_dir: Path) -> dict[str, Any]:
    """A plain model under 2-D with no plan: its Linear and LayerNorm layers become 2-D layers."""
    ds = dataset(CONVERT["samples"], tokens=4)
    model = tiny_gpt()
    loader = ember.get_dataloader(ds, batch_size=CONVERT["batch"])
    config = {"parallel": TWO_D, "zero": None, "clip_grad_norm": CONVERT["clip"]}
    engine, loader, _, _ = ember.initialize(model, sgd(model), nn.CrossEntropyLoss(), loader, config=config)
    run = run_engine(engine, loader, CONVERT["steps"])
    grid_jobs.save_state(engine.state_dict(), out_dir / "convert.pt")
    return {
        "convert.policy": engine.parallel.name,
        "convert.layers": sorted({type(m).__name__ for m in model.modules() if type(m).__module__.startswith("ember")}),
        "convert.losses": run["losses"],
    }


def checkpoints(out_dir: Path) -> dict[str, Any]:
    saving = hooks.CheckpointHook(out_dir / "2d", every_n_steps=2, every_n_epochs=None, keep_last=3)
    whole, losses, _ = grid_jobs.fit(TWO_D, saving)
    start = out_dir / "2d" / "ckpt-e0000-s000000002.ckpt"
    out: dict[str, Any] = {}
    for name, parallel in (("same", TWO_D), ("to1d", ONE_D)):
        again = hooks.CheckpointHook(out_dir / name, every_n_steps=None, every_n_epochs=None, save_last=False)
        resumed, resumed_losses, policy = grid_jobs.fit(parallel, again, resume=start)
        out[f"ckpt2d.{name}.policy"] = policy
        out[f"ckpt2d.{name}.steps"] = sorted(resumed_losses)
        out[f"ckpt2d.{name}.loss_diff"] = max(abs(resumed_losses[s] - losses[s]) for s in resumed_losses)
        if whole is not None and resumed is not None:
            out[f"ckpt2d.{name}.param_diff"] = max_diff(resumed, whole)
    return out


def grid_four(out_dir: Path) -> dict[str, Any]:
    """Every run above, in this order (the per-Engine layouts build their groups once)."""
    torch.manual_seed(0)
    out: dict[str, Any] = {}
    for name, parallel in (("2d4", TWO_D), ("2.5d4", TWO_P5_D), ("1d", ONE_D)):
        out.update(grid_jobs.engine_run(parallel, out_dir, name))
    out.update(convert(out_dir))
    out.update(checkpoints(out_dir))
    return out
