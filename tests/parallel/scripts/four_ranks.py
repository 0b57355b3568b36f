"""torchrun, 4 processes: a 2 × 2 mesh (FSDP2 over "data", tensor parallel over "tensor"), and
the per-Engine layouts pipeline 2 × data 2 and pipeline 2 × tensor 2, each match a one-process
run of the same model and global batch; coordinates and data sharding; and the 2-D, 2.5-D and
1-D-layer checks of :mod:`tests.parallel.scripts.grid_four`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from tests.dist import report
from tests.parallel.common import dataset, max_diff, mlp, optimizer_state_diff, reference, run_engine, sgd, tiny_gpt
from tests.parallel.scripts.grid_four import grid_four
from tests.parallel.scripts.pipeline_ranks import pipeline
from torch import nn

import ember
from ember.context import ParallelLayout
from ember.parallel import plans

torch.set_num_threads(1)
STEPS, GLOBAL = 5, 32
CONFIG = {
    "seed": 0,
    "parallel": {"data": 2, "tensor": {"size": 2, "plan": plans.gpt_block(prefix="blocks.*")}},
    "zero": {"stage": 3},
    "clip_grad_norm": 0.6,
}


def two_by_two(gpt: bool) -> dict[str, Any]:
    """GPT: the launched config (stage 3, explicit plan, clipping). MLP: stage 2 with the
    recognised Sequential plan, as a per-Engine config."""
    name = "gpt" if gpt else "mlp"
    ds = dataset(GLOBAL * STEPS, tokens=4 if gpt else 0)
    make = tiny_gpt if gpt else mlp
    clip = 0.6 if gpt else None
    ref = reference(make(), sgd, ds, GLOBAL, STEPS, clip=clip)
    model = make()
    loader = ember.get_dataloader(ds, batch_size=GLOBAL // 2)
    config = None if gpt else {"zero": {"stage": 2}, "parallel": {"tensor": {"plan": None}}, "clip_grad_norm": None}
    engine, loader, _, _ = ember.initialize(model, sgd(model), nn.CrossEntropyLoss(), loader, config=config)
    first = next(iter(loader))[0]
    batches = [torch.zeros_like(first) for _ in range(4)]
    torch.distributed.all_gather(batches, first)
    run = run_engine(engine, loader, STEPS)
    state = engine.state_dict()
    out: dict[str, Any] = {
        f"{name}.loss_diff": max(abs(a - b) for a, b in zip(run["losses"], ref["losses"], strict=True)),
        f"{name}.norm_diff": max((abs(a - b) for a, b in zip(run["norms"], ref["norms"], strict=True)), default=0.0),
        f"{name}.norms_seen": len(run["norms"]),
        f"{name}.policy": engine.parallel.name,
        f"{name}.sampler": [loader.sampler.num_replicas, loader.sampler.rank],
        # ranks 0,1 are one TP group (data coordinate 0), ranks 2,3 the other
        f"{name}.tp_peers_same_batch": bool(
            torch.equal(batches[0], batches[1]) and torch.equal(batches[2], batches[3])
        ),
        f"{name}.dp_ranks_differ": not torch.equal(batches[0], batches[2]),
        f"{name}.placements": sorted({str(p.placements) for p in model.parameters()}),
    }
    if ember.context.rank == 0:
        out[f"{name}.param_diff"] = max_diff(state["model"], ref["model"])
        out[f"{name}.optim_diff"] = optimizer_state_diff(state["optimizer"], ref["optimizer"])
    return out


def group_members() -> dict[str, Any]:
    """Per-Engine-style layouts of the 4 ranks: every sub-dimension's group holds the ranks that
    ``ParallelLayout.group_ranks`` names, and this rank's place in it is its coordinate."""
    out: dict[str, Any] = {}
    layouts = {
        "2d": ParallelLayout(data=1, tensor=4, tensor_mode="2d"),
        "2.5d": ParallelLayout(data=1, tensor=4, tensor_mode="2.5d", tensor_depth=1),
        "expert": ParallelLayout(data=4, expert=2),
    }
    rank = ember.context.rank
    for key, layout in layouts.items():
        for name in layout.group_names:
            group = ember.context.get_group(name, layout)
            size = layout.size(name)
            members = [torch.zeros((), dtype=torch.long) for _ in range(size)]
            if group is None:
                members = [torch.tensor(rank)]
            else:
                torch.distributed.all_gather(members, torch.tensor(rank), group=group)
            mine = next(g for g in layout.group_ranks(name) if rank in g)
            out[f"groups.{key}.{name}"] = [[int(m) for m in members], mine, layout.coords(rank)[name]]
    return out


def ddp_resume() -> dict[str, Any]:
    """DDP on 4 ranks with ``deterministic=True``: 4 updates, a new Engine loaded with that state
    (as a resume builds one), 4 more — bit-identical to 8 updates in one Engine."""
    ds = dataset(GLOBAL * 8)
    config = {"deterministic": True, "parallel": {"data": 4, "tensor": 1}, "zero": None, "clip_grad_norm": None}

    def engine() -> tuple[Any, Any]:
        model = mlp()
        loader = ember.get_dataloader(ds, batch_size=GLOBAL // 4)
        engine, loader, _, _ = ember.initialize(model, sgd(model), nn.CrossEntropyLoss(), loader, config=config)
        return engine, loader

    whole, loader = engine()
    run_engine(whole, loader, 8)
    first, loader = engine()
    run_engine(first, loader, 4)
    resumed, loader = engine()
    resumed.load_state_dict(first.state_dict())
    batches = iter(loader)
    for _ in range(4):
        next(batches)
    for x, y in batches:
        resumed.zero_grad()
        resumed.backward(resumed.criterion(resumed(x), y))
        resumed.step()
    a, b = whole.state_dict()["model"], resumed.state_dict()["model"]
    return {"ddp_resume.bitwise": all(torch.equal(a[k], b[k]) for k in a)}


def main() -> None:
    ctx = ember.launch_from_torch(config=CONFIG, verbose=False)
    out: dict[str, Any] = {
        "coords": ctx.coords,
        "dp": [ctx.data_parallel_rank, ctx.data_parallel_size],
        "mesh_shape": list(ctx.mesh.shape),
        "context_module": [ember.context.coords, ember.context.data_parallel_size],
    }
    out.update(group_members())
    out.update(ddp_resume())
    out.update(two_by_two(gpt=True))
    out.update(two_by_two(gpt=False))
    # Pipeline 2 × data 2 (DDP inside each stage), a per-Engine layout: batches of 16 per replica.
    out.update(pipeline("pp_dp", {"size": 2, "microbatches": 2, "schedule": "1f1b"}, 16, 1, 0.6, data=2))
    # Pipeline 2 × tensor 2: the 2-block GPT split at blocks.1, each stage's block tensor-parallel
    # (ranks 0, 1: stage 0; 2, 3: stage 1), one replica taking the global batch of 32.
    tensor = {"size": 2, "plan": plans.gpt_block(prefix="blocks.*")}
    pipe = {"size": 2, "microbatches": 2, "schedule": "1f1b", "split_points": ["blocks.1"]}
    checkpoint = Path(os.environ["EMBER_TEST_OUT"]) / "pp_tp_ckpt"  # one folder on this machine for all ranks
    out.update(pipeline("pp_tp", pipe, GLOBAL, 1, 0.6, data=1, tensor=tensor, layers=2, checkpoint=checkpoint))
    # Pipeline 2 × data 2 with ZeRO-1: each stage's optimizer state sharded over its 2 replicas.
    out.update(pipeline("pp_zero1", {"size": 2, "microbatches": 2}, 16, 1, 0.6, data=2, zero={"stage": 1}))
    # Issue 27: 2-D, 2.5-D and 1-D layers, a converted plain model, 2-D sharded checkpoints -> 1-D.
    out.update(grid_four(Path(os.environ.get("EMBER_GRID_OUT") or os.environ["EMBER_TEST_OUT"])))
    report(out)


if __name__ == "__main__":
    main()
