"""torchrun, 2 processes: pipeline 2 with GPipe and with 1F1B through the Trainer matches a
one-process run of the same model and global batch; evaluation, state dicts and loading work."""

from __future__ import annotations

from typing import Any

import torch
from tests.dist import report
from tests.parallel.common import dataset, global_mean, max_diff, optimizer_state_diff, reference, sgd, stack_gpt
from torch import nn
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
    name: str, pipe: dict[str, Any], batch: int, accumulation: int, clip: float | None, data: int = 1
) -> dict[str, Any]:
    """Trainer.fit for 5 updates under ``pipe`` (× ``data`` replicas, batches of ``batch`` each)
    against plain PyTorch on the global batches of 32; then evaluation, state dict, loading."""
    ds, test_ds = dataset(GLOBAL * STEPS, tokens=4), dataset(20, tokens=4, seed=7)
    ref_model = stack_gpt()
    ref = reference(ref_model, sgd, ds, GLOBAL, STEPS, clip=clip)
    ref_test = eval_reference(ref_model, test_ds)
    model = stack_gpt()
    # Per-Engine settings over whatever was launched (the 4-rank script launched FSDP × TP).
    config = {
        "parallel": {"pipeline": pipe, "data": data, "tensor": 1},
        "zero": None,
        "gradient_accumulation": accumulation,
        "clip_grad_norm": clip,
    }
    train_dl, test_dl = DataLoader(ds, batch_size=batch), DataLoader(test_ds, batch_size=8)
    engine, train_dl, test_dl, _ = ember.initialize(
        model, sgd(model), nn.CrossEntropyLoss(), train_dl, test_dl, config=config
    )
    recorder = Recorder()
    trainer = Trainer(engine, schedule=engine.schedule)
    trainer.fit(train_dl, max_steps=STEPS, hooks=[recorder, hooks.LossHook()])
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
    }
    if ember.context.rank == 0:
        out[f"{name}.param_diff"] = max_diff(state["model"], ref["model"])
        out[f"{name}.optim_diff"] = optimizer_state_diff(state["optimizer"], ref["optimizer"])
        plain = stack_gpt()
        plain.load_state_dict(state["model"])  # the one-process format: loads into the full model
        sgd(plain).load_state_dict(state["optimizer"])
    else:
        out[f"{name}.other_rank_state"] = [sorted(state["model"]), sorted(state["optimizer"])]
    # Loading rank 0's full state (broadcast) gives every stage back its part, exactly.
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    with torch.no_grad():
        for p in engine.model.parameters():
            p.zero_()
    engine.load_state_dict(state)
    out[f"{name}.load_diff"] = max_diff(engine.model.state_dict(), before)
    return out


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
