"""torchrun, 8 processes: the seed's Colossal-AI config and every 8-rank tensor mode in one launch.

Launched with seed 001's config (``fp16=dict(mode=AMP_TYPE.TORCH)``, ``parallel=dict(pipeline=2,
tensor=dict(size=4, mode='2d'))``) plus ``NUM_MICRO_BATCHES``:

* ``seed``: the seed's program as written for ember.compat.colossalai — the ViT built from
  ``colossalai.nn`` layers inside a ``PipelinableContext``, ``colossalai.initialize``,
  ``Trainer(engine, logger)`` without ``schedule=`` — in fp16 against plain fp32 PyTorch; an inf
  written into one stage-1 rank's gradient at the last update must make every rank skip it;
* ``pipe2d``: the same split model in fp32 (a per-Engine ``amp=None``), clipping and a StepLR,
  through an Engine loop (``engine.schedule.forward_backward(engine, ...)``, ``engine.step()``),
  against one process within 1e-6;
* per-Engine layouts, the Engine loop against one process: ``2d`` (2 × 2 × data 2, gradient
  accumulation 2), ``2.5d`` (depth 2 × 2 × 2), ``3d`` (2 × 2 × 2);
* ``ckpt3d``, ``ckpt2.5d``: 3-D and 2.5-D Trainer runs saving sharded checkpoints (update 2 and
  the end) into ``OUT/3d`` and ``OUT/2.5d``, resumed from update 2 on the same layout
  (bit-identical); the 3-D run's final whole weights written to ``OUT/3d-final.pt`` for the
  one-process resume of the test.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from tests.dist import report
from tests.parallel import grid_jobs
from tests.parallel.vit import ViT, images

import ember.compat.colossalai as colossalai
import ember.compat.colossalai.nn as col_nn
from ember.compat.colossalai.amp import AMP_TYPE
from ember.compat.colossalai.context import ParallelMode
from ember.compat.colossalai.core import global_context as gpc
from ember.compat.colossalai.logging import get_dist_logger
from ember.compat.colossalai.nn.metric import Accuracy
from ember.compat.colossalai.pipeline import PipelinableContext
from ember.compat.colossalai.trainer import Trainer, hooks
from ember.compat.colossalai.utils import get_dataloader

torch.set_num_threads(1)
OUT = Path(sys.argv[1]) if __name__ == "__main__" else Path()  # imported by the test: MODES only
CONFIG = dict(
    BATCH_SIZE=8, NUM_EPOCHS=1, NUM_MICRO_BATCHES=2, seed=0,
    fp16=dict(mode=AMP_TYPE.TORCH),
    parallel=dict(pipeline=2, tensor=dict(size=4, mode="2d")),
)  # fmt: skip


class Record(hooks.BaseHook):
    """Each update's loss, loss scale and whether it was skipped; an inf into one rank's
    gradient (``poison`` on that rank) before the last update."""

    def __init__(self, engine: Any, poison: torch.Tensor | None) -> None:
        super().__init__(priority=10)
        self.engine, self.poison = engine, poison
        self.losses: list[float] = []
        self.scales: list[float] = []
        self.skipped: list[bool] = []

    def after_train_iter(self, trainer: Any, output: Any, label: Any, loss: Any) -> None:
        self.losses.append(float(loss))
        self.scales.append(self.engine.precision.loss_scale)
        self.skipped.append(self.engine.last_step_skipped)
        if self.poison is not None and len(self.losses) == 3:  # the next update's gradient gets an inf
            self.poison.register_hook(lambda g: torch.full_like(g, float("inf")))


def split_vit() -> Any:
    """The seed program's model: colossalai.nn layers, split by PipelinableContext."""
    pipelinable = PipelinableContext()
    with pipelinable:
        model = ViT(col_nn)
    model.load_state_dict(grid_jobs.initial())
    pipelinable.to_layer_list()
    pipelinable.policy = "uniform"
    return pipelinable.partition(1, gpc.pipeline_parallel_size, gpc.get_local_rank(ParallelMode.PIPELINE))


def seed_program() -> dict[str, Any]:
    model = split_vit()
    optimizer = torch.optim.SGD(model.parameters(), lr=grid_jobs.LR, momentum=0.9)
    train_dl = get_dataloader(images(grid_jobs.SAMPLES), batch_size=gpc.config.BATCH_SIZE)
    criterion = col_nn.CrossEntropyLoss()
    engine, train_dl, _, _ = colossalai.initialize(model, optimizer, criterion, train_dl)
    stage, t = gpc.get_local_rank(ParallelMode.PIPELINE), gpc.get_local_rank(ParallelMode.TENSOR)
    poison = engine.model.get_parameter("_module_list.5.weight") if (stage, t) == (1, 0) else None
    record = Record(engine, poison)
    trainer = Trainer(engine=engine, logger=get_dist_logger())
    from ember.trainer import hooks as native  # ember's AccuracyHook measures training accuracy too

    accuracy = native.AccuracyHook(accuracy_func=Accuracy(), on=("train",))  # Accuracy2D: this rank's rows
    hook_list = [record, accuracy]
    trainer.fit(train_dataloader=train_dl, epochs=gpc.config.NUM_EPOCHS, hooks=hook_list, display_progress=False)
    return {
        "seed.policy": engine.parallel.name, "seed.schedule": type(trainer.schedule).__name__,
        "seed.criterion": type(criterion).__name__, "seed.accuracy": trainer.history.values("train/accuracy"),
        "seed.metric": type(accuracy.accuracy_func).__name__,
        "seed.losses": record.losses,
        "seed.scales": record.scales, "seed.skipped": record.skipped, "seed.updates": engine.num_updates,
        "seed.gpc": [
            gpc.get_local_rank(ParallelMode.PARALLEL_2D_ROW), gpc.get_local_rank(ParallelMode.PARALLEL_2D_COL),
            gpc.get_world_size(ParallelMode.PARALLEL_2D_ROW), gpc.is_initialized(ParallelMode.PARALLEL_3D_INPUT),
        ],
    }  # fmt: skip


def pipeline_fp32() -> dict[str, Any]:
    """The split model in fp32 through an Engine loop (no Trainer): the pipeline schedule runs
    each batch, ``engine.step()`` and the StepLR follow."""
    import ember

    model = split_vit()
    optimizer = torch.optim.SGD(model.parameters(), lr=grid_jobs.LR, momentum=0.9)
    loader = ember.get_dataloader(images(grid_jobs.SAMPLES), batch_size=grid_jobs.GLOBAL)
    pipeline = {"split_points": list(model.pipeline_split_points), "microbatches": 2}
    config = {"amp": None, "clip_grad_norm": 0.5, "parallel": {"pipeline": pipeline}}
    engine, loader, _, _ = ember.initialize(model, optimizer, col_nn.CrossEntropyLoss(), loader, config=config)
    sched = torch.optim.lr_scheduler.StepLR(engine.optimizer, step_size=2, gamma=0.5)
    losses = []
    for batch in loader:
        result = engine.schedule.forward_backward(engine, batch, boundary=True)
        if engine.step():
            sched.step()
        losses.append(float(result["loss"]))
    grid_jobs.save_state(engine.state_dict(), OUT / "pipe2d.pt")
    return {"pipe2d.losses": losses}


MODES = {
    "2d": ({"pipeline": 1, "data": 2, "tensor": {"size": 4, "mode": "2d"}}, {"gradient_accumulation": 2}),
    "2.5d": ({"pipeline": 1, "tensor": {"size": 8, "mode": "2.5d", "depth": 2}}, {}),
    "3d": ({"pipeline": 1, "tensor": {"size": 8, "mode": "3d"}}, {}),
}
"""The per-Engine layouts and their extra settings (the test's references take the same)."""


def engine_modes() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (parallel, more) in MODES.items():
        out.update(grid_jobs.engine_run(parallel, OUT, name, **more))
    return out


def checkpoints() -> dict[str, Any]:
    """3-D and 2.5-D: sharded checkpoints at update 2 and the end, and a resume from update 2."""
    from ember.trainer import hooks as native

    out: dict[str, Any] = {}
    for name, (parallel, _) in (("3d", MODES["3d"]), ("2.5d", MODES["2.5d"])):
        saving = native.CheckpointHook(OUT / name, every_n_steps=2, every_n_epochs=None, keep_last=3)
        whole, losses, _ = grid_jobs.fit(parallel, saving)
        again = native.CheckpointHook(OUT / f"{name}-again", every_n_steps=None, every_n_epochs=None, save_last=False)
        resumed, resumed_losses, _ = grid_jobs.fit(parallel, again, resume=OUT / name / "ckpt-e0000-s000000002.ckpt")
        out[f"ckpt{name}.saved"] = sorted(p.name for p in (OUT / name).iterdir())
        out[f"ckpt{name}.resumed_steps"] = sorted(resumed_losses)
        out[f"ckpt{name}.loss_same"] = all(resumed_losses[s] == losses[s] for s in resumed_losses)
        if whole is not None and resumed is not None:
            out[f"ckpt{name}.bit_identical"] = all(torch.equal(whole[k], resumed[k]) for k in whole)
            torch.save(whole, OUT / f"{name}-final.pt")
    return out


if __name__ == "__main__":
    colossalai.launch_from_torch(config=CONFIG, verbose=False)
    result: dict[str, Any] = {}
    for part in (seed_program, pipeline_fp32, engine_modes, checkpoints):
        result.update(part())
    report(result)
