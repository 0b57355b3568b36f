"""torchrun, 2 processes: pipeline 2 with GPipe and with 1F1B through the Trainer matches a
one-process run of the same model and global batch; evaluation, state dicts and loading work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tests.dist import report
from tests.parallel.common import dataset, global_mean, max_diff, optimizer_state_diff, reference, sgd, stack_gpt
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader

import ember
from ember.trainer import Trainer, hooks
from ember.trainer.hooks.base import BaseHook

torch.set_num_threads(1)
STEPS, GLOBAL = 5, 32


class Recorder(BaseHook):
    """Every training batch's loss (as the hooks see it), label checksum and output shape."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []
        self.labels: list[int] = []
        self.outputs: list[list[int] | None] = []
        self.norms: list[float] = []

    def after_train_iter(self, output: Any, label: Any, loss: Any) -> None:
        self.losses.append(float(loss))
        self.labels.append(int(label.sum()))
        self.outputs.append(None if output is None else list(output.shape))
        norm = self.trainer.engine.last_grad_norm
        if self.trainer.step_applied and norm is not None:
            self.norms.append(float(norm))


def eval_reference(model: nn.Module, ds: Any) -> tuple[float, float]:
    """Loss and accuracy of ``model`` on the whole of ``ds`` in one process."""
    x, y = ds.tensors
    with torch.no_grad():
        out = model(x)
    return float(nn.functional.cross_entropy(out, y)), float((out.argmax(-1) == y).float().mean())


def pipeline(
    name: str, pipe: dict[str, Any], batch: int, accumulation: int, clip: float | None, data: int = 1,
    tensor: Any = 1, zero: Any = None, layers: int = 4, checkpoint: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Trainer.fit for 5 updates under ``pipe`` (× ``data`` replicas, batches of ``batch`` each;
    ``tensor``/``zero`` as in the config) of a ``StackGPT`` with ``layers`` blocks against plain
    PyTorch on the global batches of 32; then evaluation, state dict, loading. With ``checkpoint``
    (a directory) the fit saves every 2 updates, and a fresh Engine resumes from update 4."""
    ds, test_ds = dataset(GLOBAL * STEPS, tokens=4), dataset(20, tokens=4, seed=7)
    ref_model = stack_gpt(layers=layers)
    ref = reference(ref_model, sgd, ds, GLOBAL, STEPS, clip=clip)
    ref_test = eval_reference(ref_model, test_ds)
    model = stack_gpt(layers=layers)
    # Per-Engine settings over whatever was launched (the 4-rank script launched FSDP × TP).
    config = {
        "parallel": {"pipeline": pipe, "data": data, "tensor": tensor},
        "zero": zero,
        "gradient_accumulation": accumulation,
        "clip_grad_norm": clip,
    }
    train_dl, test_dl = DataLoader(ds, batch_size=batch), DataLoader(test_ds, batch_size=8)
    engine, train_dl, test_dl, _ = ember.initialize(
        model, sgd(model), nn.CrossEntropyLoss(), train_dl, test_dl, config=config
    )
    recorder = Recorder()
    trainer = Trainer(engine, schedule=engine.schedule)
    saving = [hooks.CheckpointHook(checkpoint, every_n_steps=2)] if checkpoint is not None else []
    trainer.fit(train_dl, max_steps=STEPS, hooks=[recorder, hooks.LossHook(), *saving])
    metrics = trainer.evaluate(test_dl, hooks=[hooks.LossHook(), hooks.AccuracyHook()])
    losses = recorder.losses
    per_update = [sum(losses[i : i + accumulation]) / accumulation for i in range(0, len(losses), accumulation)]
    per_update = [global_mean(torch.tensor(v)) for v in per_update]  # the mean over the data replicas
    state = engine.state_dict()
    out: dict[str, Any] = {
        f"{name}.loss_diff": max(abs(a - b) for a, b in zip(per_update, ref["losses"], strict=True)),
        f"{name}.norm_diff": max((abs(a - b) for a, b in zip(recorder.norms, ref["norms"], strict=True)), default=0.0),
        f"{name}.norms_over_clip": sum(n > (clip or 0) for n in ref["norms"]),
        f"{name}.steps": trainer.cur_step,
        f"{name}.labels": recorder.labels,
        f"{name}.outputs": recorder.outputs[:1],
        f"{name}.stage_layers": list(engine.model.layer_names),
        f"{name}.test_loss_diff": abs(metrics["test/loss"] - ref_test[0]),
        f"{name}.test_accuracy_diff": abs(metrics["test/accuracy"] - ref_test[1]),
        f"{name}.policy": engine.parallel.name,
        f"{name}.direct_forward_error": _direct_forward_error(engine),
        f"{name}.placements": sorted({str(getattr(p, "placements", "plain")) for p in engine.model.parameters()}),
        f"{name}.optimizer_type": type(engine.optimizer).__name__,
    }
    if ember.context.rank == 0:
        out[f"{name}.param_diff"] = max_diff(state["model"], ref["model"])
        out[f"{name}.optim_diff"] = optimizer_state_diff(state["optimizer"], ref["optimizer"])
        plain = stack_gpt(layers=layers)
        plain.load_state_dict(state["model"])  # the one-process format: loads into the full model
        sgd(plain).load_state_dict(state["optimizer"])
    else:
        out[f"{name}.other_rank_state"] = [sorted(state["model"]), sorted(state["optimizer"])]
    # Loading rank 0's full state (broadcast) gives every stage back its part (and shard), exactly.
    before = _local_state(engine)
    with torch.no_grad():
        for p in engine.model.parameters():
            p.zero_()
    engine.load_state_dict(state)
    out[f"{name}.load_diff"] = max_diff(_local_state(engine), before)
    if checkpoint is not None:
        out.update(_resumed(name, checkpoint, config, DataLoader(ds, batch_size=batch), layers, ref))
    return out


def _resumed(
    name: str, checkpoint: Path, config: dict[str, Any], loader: DataLoader, layers: int, ref: dict[str, Any]
) -> dict[str, Any]:
    """A fresh Engine (other initial weights) resumes from the single-file checkpoint of update 4
    and runs update 5: it must end where the one-process reference ended."""
    model = stack_gpt(seed=3, layers=layers)
    engine, loader, _, _ = ember.initialize(model, sgd(model), nn.CrossEntropyLoss(), loader, config=config)
    trainer = Trainer(engine, schedule=engine.schedule)
    saved = sorted(p.name for p in checkpoint.iterdir())
    recorder = Recorder()
    resumed_hooks = [recorder, hooks.LossHook(), hooks.CheckpointHook(checkpoint, every_n_steps=2)]  # as saved
    trainer.fit(loader, max_steps=STEPS, hooks=resumed_hooks, resume=checkpoint / "ckpt-e0000-s000000004.ckpt")
    state = engine.state_dict()
    out: dict[str, Any] = {
        f"{name}.resumed_steps": trainer.cur_step,
        f"{name}.resumed_batches": len(recorder.losses),
        f"{name}.checkpoints": saved,
    }
    if ember.context.rank == 0:
        out[f"{name}.resume_param_diff"] = max_diff(state["model"], ref["model"])
        out[f"{name}.resume_optim_diff"] = optimizer_state_diff(state["optimizer"], ref["optimizer"])
    return out


def _local_state(engine: ember.Engine) -> dict[str, torch.Tensor]:
    """This rank's stage's parameters, tensor-parallel ones as their local shards (copies)."""
    return {k: (v.to_local() if isinstance(v, DTensor) else v).clone() for k, v in engine.model.state_dict().items()}


def _direct_forward_error(engine: ember.Engine) -> str:
    try:
        engine(torch.zeros(2, 4, 8))
    except ember.errors.EngineError as exc:
        return str(exc)
    return ""


def main() -> None:
    ctx = ember.launch_from_torch(config={"seed": 0, "parallel": {"pipeline": 2}}, verbose=False)
    out: dict[str, Any] = {"coords": ctx.coords, "dp": [ctx.data_parallel_rank, ctx.data_parallel_size]}
    # GPipe: named split point, accumulation 2 (batches of 16 make the global batch of 32).
    out.update(pipeline("gpipe", {"size": 2, "microbatches": 2, "split_points": ["blocks.2"]}, 16, 2, None))
    # 1F1B: an even split, 4 micro-batches, clipping across both stages.
    out.update(pipeline("1f1b", {"size": 2, "microbatches": 4, "schedule": "1f1b"}, GLOBAL, 1, 0.6))
    report(out)


if __name__ == "__main__":
    main()
