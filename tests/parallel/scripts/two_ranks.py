"""torchrun, 2 processes: ZeRO-1, FSDP2 stage 3 and 2, bf16 FSDP2 and tensor parallel 2 each
match a one-process run of the same model and global batch; state dicts are full on rank 0."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tests.dist import report
from tests.parallel.common import (
    adamw_groups,
    dataset,
    max_diff,
    mlp,
    optimizer_state_diff,
    reference,
    run_engine,
    sgd,
    tiny_gpt,
)
from torch import nn
from torch.utils.data import DataLoader

import ember
from ember.parallel import plans

torch.set_num_threads(1)
STEPS, GLOBAL = 5, 32


def compare(
    name: str, engine: ember.Engine, run: dict[str, Any], ref: dict[str, Any], plain: Callable[[], Any]
) -> dict[str, Any]:
    """Full parameters, losses, clip norms and optimizer state against the reference; ``plain``
    builds the same optimizer over a fresh one-process model, which must load the state."""
    state = engine.state_dict()
    out: dict[str, Any] = {
        f"{name}.loss_diff": max(abs(a - b) for a, b in zip(run["losses"], ref["losses"], strict=True)),
        f"{name}.norm_diff": max((abs(a - b) for a, b in zip(run["norms"], ref["norms"], strict=True)), default=0.0),
        f"{name}.optimizer_type": type(engine.optimizer).__name__,
    }
    if ember.context.rank == 0:
        out[f"{name}.param_diff"] = max_diff(state["model"], ref["model"])
        out[f"{name}.optim_diff"] = optimizer_state_diff(state["optimizer"], ref["optimizer"])
        loaded = plain()
        loaded.load_state_dict(state["optimizer"])
        out[f"{name}.one_process_load_diff"] = optimizer_state_diff(loaded.state_dict(), ref["optimizer"])
    else:
        out[f"{name}.other_rank_state"] = [sorted(state["model"])[:1], sorted(state["optimizer"])]
    return out


def zero1() -> dict[str, Any]:
    ds = dataset(GLOBAL * STEPS)
    ref = reference(mlp(), adamw_groups, ds, GLOBAL, STEPS)
    model = mlp()
    opt = adamw_groups(model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    engine, loader, _, sched = ember.initialize(
        model, opt, nn.CrossEntropyLoss(), DataLoader(ds, batch_size=GLOBAL // 2), lr_scheduler=sched,
        config={"zero": {"stage": 1}},
    )  # fmt: skip
    run = run_engine(engine, loader, STEPS)
    out = compare("zero1", engine, run, ref, lambda: adamw_groups(mlp()))
    out["zero1.scheduler_follows"] = sched.optimizer is engine.optimizer
    out["zero1.local_params"] = sum(len(g["params"]) for g in engine.optimizer.optim.param_groups)
    out["zero1.ranks_params_equal"] = max_diff(model.state_dict(), ref["model"])
    out.update(round_trip("zero1", engine, lambda seed: mlp(seed), adamw_groups, {"zero": {"stage": 1}}))
    return out


def fsdp(stage: int) -> dict[str, Any]:
    """Stage 3 on the GPT with accumulation 2 and clipping; stage 2 on the MLP."""
    gpt = stage == 3
    ds = dataset(GLOBAL * STEPS, tokens=4 if gpt else 0)
    make = tiny_gpt if gpt else mlp
    clip = 0.6 if gpt else None
    ref = reference(make(), sgd, ds, GLOBAL, STEPS, clip=clip)
    model = make()
    accumulation = 2 if gpt else 1
    config = {"zero": {"stage": stage}, "gradient_accumulation": accumulation, "clip_grad_norm": clip}
    loader = DataLoader(ds, batch_size=GLOBAL // 2 // accumulation)
    engine, loader, _, _ = ember.initialize(model, sgd(model), nn.CrossEntropyLoss(), loader, config=config)
    run = run_engine(engine, loader, STEPS)
    out = compare(f"fsdp{stage}", engine, run, ref, lambda: sgd(make()))
    out[f"fsdp{stage}.policy"] = engine.parallel.name
    if gpt:
        out.update(round_trip(f"fsdp{stage}", engine, make, sgd, config))
    return out


def round_trip(name: str, engine: ember.Engine, make: Any, make_opt: Any, config: dict[str, Any]) -> dict[str, Any]:
    """The saved state loads into a fresh Engine of the same mode and gives back the same state:
    given on rank 0 only ({} elsewhere: broadcast), and given on every rank."""
    state = engine.state_dict()
    out: dict[str, Any] = {}
    for mode in ("broadcast", "all_ranks"):
        fresh = make(seed=7)
        other, _, _, _ = ember.initialize(fresh, make_opt(fresh), nn.CrossEntropyLoss(), config=config)
        given = state if mode == "broadcast" else ember.distributed.broadcast_object(state)
        other.load_state_dict(given)
        again = other.state_dict()
        if ember.context.rank == 0:
            out[f"{name}.load_{mode}.param_diff"] = max_diff(again["model"], state["model"])
            out[f"{name}.load_{mode}.optim_diff"] = optimizer_state_diff(again["optimizer"], state["optimizer"])
        out[f"{name}.load_{mode}.num_updates"] = other.num_updates
    return out


def fsdp_bf16() -> dict[str, Any]:
    ds = dataset(GLOBAL * STEPS)
    ref = reference(mlp(), sgd, ds, GLOBAL, STEPS)
    model = mlp()
    config = {"zero": {"stage": 3, "mixed_precision": "bf16"}}
    engine, loader, _, _ = ember.initialize(
        model, sgd(model), nn.CrossEntropyLoss(), DataLoader(ds, batch_size=GLOBAL // 2), config=config
    )
    run = run_engine(engine, loader, STEPS)
    state = engine.state_dict()
    out = {"bf16.loss_diff": max(abs(a - b) for a, b in zip(run["losses"], ref["losses"], strict=True))}
    if ember.context.rank == 0:
        out["bf16.param_diff"] = max_diff(state["model"], ref["model"])
        out["bf16.dtypes"] = sorted({str(v.dtype) for v in state["model"].values()})
    return out


def tensor_parallel(gpt: bool) -> dict[str, Any]:
    """TP 2 (dp 1: both ranks see the whole global batch); explicit plan on the GPT, the
    recognised Sequential MLP plan on the MLP."""
    name = "tp_gpt" if gpt else "tp_mlp"
    ds = dataset(GLOBAL * STEPS, tokens=4 if gpt else 0)
    make = tiny_gpt if gpt else mlp
    clip = 0.6 if gpt else None
    ref = reference(make(), sgd, ds, GLOBAL, STEPS, clip=clip)
    model = make()
    tensor = {"size": 2, "plan": plans.gpt_block(prefix="blocks.*")} if gpt else 2
    config = {"parallel": {"tensor": tensor}, "clip_grad_norm": clip}
    # Built for the launched layout (data=2), re-sharded by initialize for this Engine's dp=1.
    loader = ember.get_dataloader(ds, batch_size=GLOBAL)
    engine, loader, _, _ = ember.initialize(model, sgd(model), nn.CrossEntropyLoss(), loader, config=config)
    first = next(iter(loader))[0]
    same = [torch.zeros_like(first) for _ in range(2)]
    torch.distributed.all_gather(same, first)
    run = run_engine(engine, loader, STEPS)
    out = compare(name, engine, run, ref, lambda: sgd(make()))
    out[f"{name}.sampler"] = [loader.sampler.num_replicas, loader.sampler.rank]
    out[f"{name}.same_batch_on_tp_ranks"] = bool(torch.equal(same[0], same[1]))
    out[f"{name}.dtensor_params"] = sum(type(p).__name__ == "DTensor" for p in model.parameters())
    return out


EARLY_MODES = {"ddp": {}, "zero1": {"zero": {"stage": 1}}, "zero3": {"zero": {"stage": 3}}}


def early_scheduler(mode: str, how: str) -> dict[str, Any]:
    """A scheduler built over the user's optimizer before ``initialize`` and not passed to it,
    stepped after every update by hand (``how="engine"``) or by ``LRSchedulerHook``: the
    learning rates the stepping optimizer used and the final parameters (rank 0)."""
    from tests.trainer.helpers import RecordingLogger

    from ember.trainer import Trainer, hooks

    ds = dataset(GLOBAL * STEPS)
    model = mlp()
    opt = adamw_groups(model)  # two groups, two learning rates
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2 * STEPS, eta_min=0.001)
    loader = DataLoader(ds, batch_size=GLOBAL // 2)
    engine, loader, _, _ = ember.initialize(model, opt, nn.CrossEntropyLoss(), loader, config=EARLY_MODES[mode])
    used: list[list[float]] = []

    def record() -> None:
        used.append([g["lr"] for g in engine.optimizer.param_groups])

    if how == "engine":
        for _ in range(2):
            for x, y in loader:
                engine.zero_grad()
                engine.backward(engine.criterion(engine(x), y))
                record()
                engine.step()
                sched.step()
    else:

        class Record(hooks.BaseHook):
            def before_train_iter(self) -> None:
                record()

        hook = hooks.LRSchedulerHook(sched, by_epoch=False)
        try:
            Trainer(engine, logger=RecordingLogger()).fit(loader, epochs=2, hooks=[hook, Record()])
        except ember.errors.HookError as exc:  # e.g. "drives a different optimizer": the test shows it
            used.append([str(exc)])
    state = engine.state_dict()
    out: dict[str, Any] = {"lrs": used, "user_view": opt.param_groups is engine.optimizer.param_groups}
    if ember.context.rank == 0:
        out["model"] = {k: v.tolist() for k, v in state["model"].items()}
    return out


def early_schedulers() -> dict[str, Any]:
    runs = {f"{mode}.{how}": early_scheduler(mode, how) for mode in EARLY_MODES for how in ("engine", "hook")}
    out: dict[str, Any] = {}
    for name, run in runs.items():
        ref = runs["ddp." + name.split(".")[1]]
        same_length = len(run["lrs"]) == len(ref["lrs"]) and all(isinstance(v[0], float) for v in run["lrs"])
        out[f"early.{name}.lr_diff"] = (
            max(abs(a - b) for x, y in zip(run["lrs"], ref["lrs"], strict=True) for a, b in zip(x, y, strict=True))
            if same_length
            else run["lrs"][-1:]
        )
        out[f"early.{name}.steps"] = len(run["lrs"])
        out[f"early.{name}.lr_changed"] = run["lrs"][0] != run["lrs"][-1]
        out[f"early.{name}.user_view"] = run["user_view"]
        if "model" in run:
            out[f"early.{name}.param_diff"] = max(
                (torch.tensor(run["model"][k]) - torch.tensor(ref["model"][k])).abs().max().item() for k in ref["model"]
            )
    return out


def main() -> None:
    ctx = ember.launch_from_torch(config={"seed": 0}, verbose=False)
    out: dict[str, Any] = {
        "coords": ctx.coords,
        "dp": [ctx.data_parallel_rank, ctx.data_parallel_size],
        "mesh_dims": list(ctx.mesh.mesh_dim_names),
        "mesh_shape": list(ctx.mesh.shape),
    }
    for part in (zero1, lambda: fsdp(3), lambda: fsdp(2), fsdp_bf16, lambda: tensor_parallel(True)):
        out.update(part())
    out.update(tensor_parallel(False))
    out.update(early_schedulers())
    report(out)


if __name__ == "__main__":
    main()
