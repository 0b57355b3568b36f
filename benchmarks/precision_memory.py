"""Weight, gradient and optimizer memory per rank for fp32, AMP and master weights (issue 28, item 6).

An MLP of 2.1 M parameters (8 layers of 512 x 512) with AdamW, built with
``ember.initialize`` under each precision, takes one step; the bytes of the tensors each rank
holds are summed (``Tensor.nbytes``, no allocator estimate):

* weights: the model's parameters; gradients: theirs after ``backward`` (the peak between steps);
* masters: the fp32 copies the optimizer steps (master weights only), and their fp32 gradients,
  which exist only inside ``engine.step()`` (one master's worth per rank, freed after the update);
* optimizer: ``optimizer.state`` (AdamW's two moments and step count).

Single-process rows run here; ZeRO-1 rows (fp32 ZeroRedundancyOptimizer; fp16 master weights with
sharded masters) on D = 2 and 4 gloo processes, reporting the largest rank (ZeRO-1 shards by whole
parameters: the biggest parameter bounds how even the shares are). Activations are left out
(autocast and low-precision weights shrink those too, by the model's shapes).

    .venv/bin/python -m benchmarks.precision_memory        # ~1 min
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

from benchmarks.figures import torchrun_json, write_figure

SINGLE = {
    "fp32": {},
    "AMP bf16 (autocast)": {"amp": "bf16"},
    "AMP fp16 (autocast + GradScaler)": {"amp": "fp16"},
    "master weights bf16": {"amp": "bf16", "master_weights": True},
    "master weights fp16": {"amp": "fp16", "master_weights": True},
}
SHARDED = {
    "ZeRO-1 fp32": {"zero": {"stage": 1}},
    "ZeRO-1 + master weights fp16": {"zero": {"stage": 1}, "amp": "fp16", "master_weights": True},
}


def measure(config: dict[str, Any]) -> dict[str, Any]:
    """One step under ``config``; the bytes held per kind of tensor."""
    import torch
    from torch import nn

    import ember

    torch.manual_seed(0)
    model = nn.Sequential(*(layer for _ in range(8) for layer in (nn.Linear(512, 512), nn.GELU())))
    engine, *_ = ember.initialize(model, torch.optim.AdamW(model.parameters(), lr=1e-3), nn.MSELoss(), config=config)
    x, y = torch.randn(32, 512), torch.randn(32, 512)
    engine.zero_grad()
    engine.backward(engine.criterion(engine(x), y))
    params = list(model.parameters())
    grads = sum(p.grad.nbytes for p in params if p.grad is not None)
    stepping = [p for group in engine.optimizer.param_groups for p in group["params"]]
    masters = sum(p.nbytes for p in stepping if all(p is not q for q in params))
    engine.step()
    optimizer = getattr(engine.optimizer, "optim", engine.optimizer)  # ZeroRedundancyOptimizer: the local one
    state = sum(t.nbytes for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor))
    return {"parameters": sum(p.numel() for p in params), "weights": sum(p.nbytes for p in params), "grads": grads,
            "masters": masters, "master_grads": masters, "optimizer": state}  # fmt: skip


def worker(out: Path) -> None:
    """Inside torchrun: the sharded rows; every rank's bytes, written by rank 0."""
    import torch
    import torch.distributed as dist

    import ember

    torch.set_num_threads(1)
    ember.launch_from_torch(config={"seed": 0})
    rows = {}
    for name, config in SHARDED.items():
        mine = measure(config)
        every: list[Any] = [None] * ember.context.world_size
        dist.all_gather_object(every, mine)
        rows[name] = max(every, key=lambda r: r["masters"] + r["optimizer"])
    if ember.context.rank == 0:
        out.write_text(json.dumps(rows))
    ember.context.reset()


def table(rows: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| precision | weights | gradients | fp32 masters | optimizer state | held between steps | bytes/param "
        "| + inside the step (master grads) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        held = r["weights"] + r["grads"] + r["masters"] + r["optimizer"]
        lines.append(
            f"| {name} | {_mb(r['weights'])} | {_mb(r['grads'])} | {_mb(r['masters'])} | {_mb(r['optimizer'])} "
            f"| {_mb(held)} | {held / r['parameters']:.1f} | {_mb(r['master_grads'])} |"
        )
    return "\n".join(lines)


def _mb(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(args.worker)
        return
    rows = {name: measure(config) for name, config in SINGLE.items()}
    for world in args.worlds:
        sharded = torchrun_json("benchmarks.precision_memory", world)
        rows.update({f"{name}, D={world} (largest rank)": r for name, r in sharded.items()})
    params = next(iter(rows.values()))["parameters"]
    text = (f"### Weight, gradient and optimizer memory per rank ({dt.date.today()}; {params:,} parameters, "
            f"AdamW)\n\n{table(rows)}\n")  # fmt: skip
    write_figure("precision-memory", text, rows)


if __name__ == "__main__":
    main()
