"""torchrun, 4 processes: expert parallelism over 4 and over 2 ranks, and fp16 master weights under
DDP and ZeRO-1, each against a reference in one process (every rank computes it for itself).

* ``ep4``: the launched layout (``parallel.expert = 4``, one expert per rank), top-1, room for
  every token, AdamW with clipping; resumed from ``engine.state_dict()`` into a fresh Engine.
* ``ep2``: a per-Engine layout (``parallel.expert = 2``: two groups of 2 ranks, 2 experts each,
  reduced over ``expert_data`` too), top-2 at a tight capacity (tokens dropped), accumulation 2.
* ``ddp``: MoE layers with every expert on every rank (``parallel.expert = 1``) under DDP.
* ``ep4_bf16``: expert parallelism with bf16 master weights, within bf16's tolerance of fp32.
* ``zero1`` / ``ddp``: fp16 master weights, sharded masters (ZeRO-1) against whole ones (DDP),
  and a ZeRO-1 resume.

The reference runs the same model with every expert on each rank's shard of the batch in turn
(each shard routed with its own capacity, as the rank routes it), the loss the mean of the
shards' losses plus their weighted load-balancing losses.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch
from tests.dist import report
from torch import nn

import ember
from ember.layout import ParallelLayout
from ember.parallel.moe import MoE, MoEStats, Router

torch.set_num_threads(1)
WORLD, DIM, EXPERTS, CLASSES, TOKENS = 4, 8, 4, 3, 12  # TOKENS per rank and micro-batch
AUX = 0.05


class Net(nn.Module):
    def __init__(self, router: Router, layout: ParallelLayout | None) -> None:
        super().__init__()
        self.embed = nn.Linear(5, DIM)
        expert = lambda: nn.Sequential(nn.Linear(DIM, 16), nn.GELU(), nn.Linear(16, DIM))  # noqa: E731
        self.moe = MoE(DIM, EXPERTS, expert, router, aux_loss_weight=AUX, layout=layout)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        return self.head(h + self.moe(h)).reshape(-1, CLASSES)


def batches(steps: int, seed: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """``[step][rank] -> (x, y)``: the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    return [
        [(torch.randn(2, TOKENS // 2, 5, generator=g), torch.randint(0, CLASSES, (TOKENS,), generator=g)) for _ in
         range(WORLD)]
        for _ in range(steps)
    ]  # fmt: skip


def reference(model: nn.Module, data: list[Any], clip: float | None, accumulation: int) -> dict[str, Any]:
    """One process, every expert: per step, each rank's shard through the model, losses averaged."""
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    stats = MoEStats.of(model)
    assert stats is not None
    losses, norms, kept, outputs = [], [], [], []
    for i in range(0, len(data), accumulation):
        opt.zero_grad()
        for step in data[i : i + accumulation]:
            total = torch.zeros(())
            for x, y in step:
                out = model(x)
                outputs.append(out.detach().clone())
                loss = nn.functional.cross_entropy(out, y)
                aux, _ = stats.pop()
                losses.append(loss.item())
                kept.append((model.moe.last_assignment.choices.clone(), model.moe.last_assignment.kept.clone()))
                total = total + loss + aux
            (total / WORLD / accumulation).backward()
        if clip is not None:
            norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
    return {"state": model.state_dict(), "opt": opt.state_dict(), "losses": losses, "norms": norms,
            "kept": kept, "outputs": outputs}  # fmt: skip


def run(engine: Any, data: list[Any], rank: int) -> dict[str, Any]:
    losses, norms, kept, outputs = [], [], [], []
    for step in data:
        x, y = step[rank]
        engine.zero_grad()
        out = engine(x)
        outputs.append(out.detach().float().clone())
        loss = engine.criterion(out, y)
        losses.append(loss.item())
        layer = engine.model.moe
        kept.append((layer.last_assignment.choices.clone(), layer.last_assignment.kept.clone()))
        engine.backward(loss)
        if engine.step() and engine.last_grad_norm is not None:
            norms.append(float(engine.last_grad_norm))
    return {"losses": losses, "norms": norms, "kept": kept, "outputs": outputs}


def diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert list(a) == list(b), (list(a), list(b))
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a.values(), b.values(), strict=True))


def equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return list(a) == list(b) and all(torch.equal(x, y) for x, y in zip(a.values(), b.values(), strict=True))


def optim_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert [g["params"] for g in a["param_groups"]] == [g["params"] for g in b["param_groups"]]
    assert sorted(a["state"]) == sorted(b["state"])
    return max(
        float((a["state"][i][k].float() - b["state"][i][k].float()).abs().max())
        for i in a["state"]
        for k in ("exp_avg", "exp_avg_sq")
    )


def expert_parallel(name: str, layout: ParallelLayout, router: Router, config: dict[str, Any]) -> dict[str, Any]:
    rank = ember.context.rank
    accumulation = config.get("gradient_accumulation", 1)
    data = batches(4 * accumulation, seed=len(name))
    torch.manual_seed(1)
    ref_model = Net(copy.deepcopy(router), ParallelLayout())
    start = copy.deepcopy(ref_model.state_dict())
    ref = reference(ref_model, data, config.get("clip_grad_norm"), accumulation)
    model = Net(router, layout)
    model.load_state_dict({k: v for k, v in start.items() if k in model.state_dict()})
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    engine, *_ = ember.initialize(model, opt, nn.CrossEntropyLoss(), config=config)
    got = run(engine, data, rank)
    mine = slice(rank, None, WORLD)
    out: dict[str, Any] = {
        f"{name}.policy": engine.parallel.name,
        f"{name}.local_experts": sorted(model.moe.experts),
        f"{name}.loss_diff": max(abs(a - b) for a, b in zip(got["losses"], ref["losses"][mine], strict=True)),
        f"{name}.out_diff": max(float((a - b).abs().max()) for a, b in zip(got["outputs"], ref["outputs"][mine],
                                                                             strict=True)),
        f"{name}.same_routing": all(torch.equal(c, rc) and torch.equal(k, rk)
                                    for (c, k), (rc, rk) in zip(got["kept"], ref["kept"][mine], strict=True)),
        f"{name}.dropped": sum(int((~k).sum()) for _, k in got["kept"]),
        f"{name}.norm_diff": max((abs(a - b) for a, b in zip(got["norms"], ref["norms"], strict=True)), default=0.0),
        f"{name}.norms": len(got["norms"]),
        f"{name}.scalars": sorted(engine.step_scalars),
    }  # fmt: skip
    state = engine.state_dict()
    if rank == 0:
        out[f"{name}.param_diff"] = diff(state["model"], ref["state"])
        out[f"{name}.optim_diff"] = optim_diff(state["optimizer"], ref["opt"])
    else:
        out[f"{name}.others_empty"] = state["model"] == {} and state["optimizer"] == {}
    return out


def resume(layout: ParallelLayout, config: dict[str, Any]) -> dict[str, Any]:
    """Two updates, ``state_dict`` into a fresh Engine, two more on both: bit-identical."""
    data = batches(4, seed=7)
    rank = ember.context.rank
    torch.manual_seed(2)
    engines = []
    for _ in range(2):
        model = Net(Router(k=2, capacity_factor=1.0), layout)
        engines.append(ember.initialize(model, torch.optim.AdamW(model.parameters(), lr=0.01), nn.CrossEntropyLoss(),
                                        config=config)[0])  # fmt: skip
    first, second = engines
    run(first, data[:2], rank)
    second.load_state_dict(copy.deepcopy(first.state_dict()))  # full on rank 0, {} elsewhere
    run(first, data[2:], rank)
    run(second, data[2:], rank)
    a, b = first.state_dict(), second.state_dict()
    return {"resume.identical": equal(a["model"], b["model"]) and a["precision"] == b["precision"]}


def master_weights() -> dict[str, Any]:
    """fp16 master weights over 4 data-parallel ranks: ZeRO-1's sharded masters equal DDP's whole
    ones, and its full state goes through ``state_dict`` / ``load_state_dict`` unchanged."""
    rank = ember.context.rank
    g = torch.Generator().manual_seed(3)
    xs, ys = torch.randn(6, WORLD, 8, 6, generator=g), torch.randint(0, 3, (6, WORLD, 8), generator=g)
    # clip_grad_norm far above the norms: the clipping code runs, and the two runs stay bit-comparable
    config = {"parallel": {"expert": 1}, "amp": "fp16", "master_weights": True, "clip_grad_norm": 100.0,
              "grad_scaler": {"init_scale": 2.0**14, "growth_interval": 2, "max_scale": 2.0**15}}  # fmt: skip

    def build(zero: Any) -> Any:
        torch.manual_seed(4)
        model = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 3))
        opt = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.1)
        return ember.initialize(model, opt, nn.CrossEntropyLoss(), config={**config, "zero": zero})[0]

    results = {}
    for name, zero in (("ddp", None), ("zero1", {"stage": 1})):
        engine = build(zero)
        norms = []
        for step in range(6):
            engine.zero_grad()
            engine.backward(engine.criterion(engine(xs[step, rank]), ys[step, rank]))
            engine.step()
            norms.append(float(engine.last_grad_norm))
        masters = sum(p.numel() for group in engine.optimizer.param_groups for p in group["params"])
        results[name] = (
            engine.state_dict(),
            norms,
            engine.parallel.name,
            next(engine.model.parameters()).dtype,
            masters,
        )
    ddp, zero1 = results["ddp"], results["zero1"]
    fresh = build({"stage": 1})
    fresh.load_state_dict(copy.deepcopy(zero1[0]))  # full on rank 0; the optimizer state {} elsewhere
    again = fresh.state_dict()
    out: dict[str, Any] = {
        "master.policies": [ddp[2], zero1[2]],
        "master.param_dtype": str(zero1[3]),
        "master.masters_here": [ddp[4], zero1[4]],
        "master.norm_diff": max(abs(a - b) for a, b in zip(ddp[1], zero1[1], strict=True)),
        "master.scale": zero1[0]["precision"],
    }
    if rank == 0:
        out["master.zero1_equals_ddp"] = equal(ddp[0]["model"], zero1[0]["model"])
        out["master.optim_diff"] = optim_diff(ddp[0]["optimizer"], zero1[0]["optimizer"])
        out["master.round_trip"] = (
            equal(zero1[0]["model"], again["model"])
            and optim_diff(zero1[0]["optimizer"], again["optimizer"]) == 0.0
            and zero1[0]["precision"] == again["precision"]
        )
        out["master.saved_dtype"] = str(next(iter(zero1[0]["model"].values())).dtype)
    return out


def main() -> None:
    ember.launch_from_torch(config={"seed": 0, "parallel": {"expert": 4}})
    four = ember.context.layout
    two = ParallelLayout(data=4, expert=2)
    out: dict[str, Any] = {"coords": ember.context.coords}
    out.update(expert_parallel("ep4", four, Router(k=1, capacity_factor=4.0), {"clip_grad_norm": 0.5}))
    tight = Router(k=2, capacity_factor=0.5, min_capacity=1)
    out.update(expert_parallel("ep2", two, tight, {"parallel": {"expert": 2}, "gradient_accumulation": 2}))
    out.update(resume(four, {"clip_grad_norm": 0.5}))
    ddp = {"parallel": {"expert": 1}, "clip_grad_norm": 0.5}  # MoE layers, every expert on every rank: DDP
    out.update(expert_parallel("ddp", ParallelLayout(data=4), Router(k=2, capacity_factor=1.0), ddp))
    bf16 = {"amp": "bf16", "master_weights": True}
    out.update(expert_parallel("ep4_bf16", four, Router(k=1, capacity_factor=4.0), bf16))
    out.update(master_weights())
    report(out)
    ember.context.reset()


if __name__ == "__main__":
    main()
    os._exit(0)
