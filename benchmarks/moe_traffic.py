"""Bytes each rank moves per training step under expert parallelism, against tokens × hidden × top-k (issue 28, item 6).

One MoE layer (``ember.parallel.moe.MoE``, 2 experts per rank, FFN experts of width 4·d) between
an embedding and a head is trained through ``ember.initialize`` with ``parallel.expert = P`` on
P gloo processes (P = 2 and 4). The collectives are counted by wrapping
``torch.distributed.all_to_all_single`` and ``all_reduce`` (what ``ember.parallel.moe`` and
``ember.parallel.moe_policy`` call): a rank *sends* ``(P-1)/P`` of an all-to-all's buffer to the
others, and a ring all-reduce of B bytes sends ``2 (P-1)/P · B``. Reported per step, on rank 0:

* all-to-all bytes sent, and the prediction ``4 · (P-1)/P · E · C · d · 4 bytes`` (two exchanges
  forward, two backward; ``E · C ≈ k · capacity_factor · tokens``), so the traffic grows as
  tokens × hidden × top-k, and not with the number of experts;
* the gradient all-reduces (the dense parameters over ``data``; experts over ``expert_data``,
  which is a single rank here, so they cost nothing);
* the step's wall time (noisy on a shared machine: indicative only).

    .venv/bin/python -m benchmarks.moe_traffic            # ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.figures import torchrun_json, write_figure

CASES = [(tokens, hidden, k) for tokens in (256, 1024, 4096) for hidden in (64, 256) for k in (1, 2)]
CAPACITY_FACTOR = 1.25


def worker(out: Path, steps: int) -> None:
    """Inside torchrun: every case, the counted bytes and times on rank 0."""
    import torch
    import torch.distributed as dist
    from torch import nn

    import ember
    from ember.parallel.moe import MoE, Router

    sent = {"all_to_all": 0, "all_reduce": 0}
    a2a, reduce = dist.all_to_all_single, dist.all_reduce

    def counted_a2a(output: torch.Tensor, input: torch.Tensor, *args: Any, group: Any = None, **kw: Any) -> Any:
        size = dist.get_world_size(group)
        sent["all_to_all"] += input.numel() * input.element_size() * (size - 1) // size
        return a2a(output, input, *args, group=group, **kw)

    def counted_reduce(tensor: torch.Tensor, *args: Any, group: Any = None, **kw: Any) -> Any:
        size = dist.get_world_size(group)
        sent["all_reduce"] += 2 * tensor.numel() * tensor.element_size() * (size - 1) // size
        return reduce(tensor, *args, group=group, **kw)

    torch.set_num_threads(1)
    ember.launch_from_torch(config={"seed": 0, "parallel": {"expert": int(os.environ["WORLD_SIZE"])}})
    dist.all_to_all_single, dist.all_reduce = counted_a2a, counted_reduce  # type: ignore[assignment]
    world = ember.context.world_size
    rows = []
    for tokens, hidden, k in CASES:
        experts = 2 * world
        ffn = lambda h=hidden: nn.Sequential(nn.Linear(h, 4 * h), nn.GELU(), nn.Linear(4 * h, h))  # noqa: E731
        moe = MoE(hidden, experts, ffn, Router(k=k, capacity_factor=CAPACITY_FACTOR))
        model = nn.Sequential(nn.Linear(16, hidden), moe, nn.Linear(hidden, 16))
        engine, *_ = ember.initialize(model, torch.optim.SGD(model.parameters(), lr=0.01), nn.MSELoss())
        x, y = torch.randn(tokens, 16), torch.randn(tokens, 16)
        times = []
        for step in range(steps + 1):
            if step == 1:  # the first step warms up; count the others
                sent.update(all_to_all=0, all_reduce=0)
            start = time.perf_counter()
            engine.zero_grad()
            engine.backward(engine.criterion(engine(x), y))
            engine.step()
            times.append(time.perf_counter() - start)
        capacity = moe.last_assignment.capacity
        predicted = 4 * (world - 1) / world * experts * capacity * hidden * 4
        step_ms = 1e3 * sorted(times[1:])[steps // 2]
        rows.append({"tokens": tokens, "hidden": hidden, "k": k, "capacity": capacity, "predicted": predicted,
                     "all_to_all": sent["all_to_all"] / steps, "all_reduce": sent["all_reduce"] / steps,
                     "step_ms": step_ms})  # fmt: skip
    if ember.context.rank == 0:
        out.write_text(json.dumps({"world": world, "rows": rows}))
    ember.context.reset()


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| ranks P | tokens/rank | hidden d | top-k | capacity C | all-to-all sent/step | predicted 4(P-1)/P·E·C·d·4 B "
        "| all-to-all / (tokens·d·k) | gradient all-reduce sent/step | step (ms, median) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        world = result["world"]
        for r in result["rows"]:
            per = r["all_to_all"] / (r["tokens"] * r["hidden"] * r["k"])
            lines.append(
                f"| {world} | {r['tokens']} | {r['hidden']} | {r['k']} | {r['capacity']} | {_mb(r['all_to_all'])} "
                f"| {_mb(r['predicted'])} | {per:.1f} B | {_mb(r['all_reduce'])} | {r['step_ms']:.1f} |"
            )
    return "\n".join(lines)


def _mb(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(args.worker, args.steps)
        return
    results = [torchrun_json("benchmarks.moe_traffic", world, "--steps", str(args.steps)) for world in args.worlds]
    text = f"### MoE all-to-all traffic per rank and step ({dt.date.today()}, gloo, CPU)\n\n{table(results)}\n"
    write_figure("moe-traffic", text, results)


if __name__ == "__main__":
    main()
