"""Peak activation memory per rank under context parallelism and activation checkpointing (issue 28, item 6).

A stack of ``--blocks`` GPT blocks (LayerNorm, causal SDPA attention, 4x MLP; hidden
``--dim``, ``--heads`` heads, batch 1) runs one forward and backward pass on sequences of 1k to
32k tokens, on 1 process (plain SDPA) and on 2 and 4 gloo processes (``parallel.context``:
ember's ring attention, zig-zag slices), each with and without activation checkpointing of
every block (``ember.parallel.checkpointing.checkpoint``, what ``activation_checkpointing=True``
does). Measured on every rank with torch's ``MemTracker`` (``torch.distributed._tools``, a
dispatch mode that follows every tensor storage), the largest over the ranks is reported:

* **peak**: activations and temporaries live at the peak of the step (parameters and gradients
  left out), in MiB; per block = peak / blocks;
* **saved**: what the forward pass leaves for the backward pass, per block (what each further
  block of a deeper model adds).

Then, for a memory budget (``--budget-mib``, default: the 1-process peak without
checkpointing at 4k tokens), the longest measured sequence whose peak fits in it, per
configuration. Kernel-internal scratch memory (the CPU flash-attention kernel's per-thread
buffers) is not a tensor and is not counted.

    .venv/bin/python -m benchmarks.context_memory                          # ~60 min on 2 shared cores
    .venv/bin/python -m benchmarks.context_memory --lengths 1024 2048 --ranks 1 2
    .venv/bin/python -m benchmarks.context_memory --tables benchmarks/results/<day>-context-memory.json --budget-mib 128
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)


def _block(dim: int, heads: int) -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.qkv, self.out = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.ln2, self.fc1, self.fc2 = nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, -1).permute(2, 0, 3, 1, 4)
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(y.transpose(1, 2).reshape(b, t, dim))
            return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))

    return Block()


def worker(args: argparse.Namespace) -> None:
    """One rank: every length, with and without checkpointing; rank 0 writes the maxima over ranks."""
    import torch
    import torch.distributed as dist
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

    from ember.parallel.context_parallel import SequenceSharding
    from ember.parallel.ring import SequenceSplit

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(_block(args.dim, args.heads) for _ in range(args.blocks))
    sharding = SequenceSharding(dist.new_group(list(range(size))), SequenceSplit(size, rank)) if size > 1 else None
    rows = []
    for length in args.lengths:
        for checkpointed in (False, True):
            x = torch.randn(1, length // size, args.dim, requires_grad=True)
            tracker = MemTracker()
            tracker.track_external(blocks)
            start = time.perf_counter()
            with tracker:
                saved, peak = _step(blocks, x, sharding, checkpointed, tracker, _MemRefType)
            seconds = time.perf_counter() - start
            found = torch.tensor([peak, saved, seconds], dtype=torch.float64)
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
            blocks.zero_grad(set_to_none=True)
            mib = (found[:2] / 2**20).tolist()
            rows.append({"ranks": size, "length": length, "checkpointing": checkpointed, "peak_mib": mib[0],
                         "saved_per_block_mib": mib[1] / args.blocks, "seconds": found[2].item()})  # fmt: skip
            if rank == 0:
                print(json.dumps(rows[-1]), flush=True)
    if rank == 0:
        Path(args.out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def _step(blocks: Any, x: Any, sharding: Any, checkpointed: bool, tracker: Any, kinds: Any) -> tuple[int, int]:
    """Forward (through the ring when ``sharding``) and backward; the bytes saved for the backward
    pass after the forward, and the peak of activations and temporaries."""
    import contextlib

    from ember.parallel.checkpointing import checkpoint

    def without_weights(snapshot: dict[Any, Any]) -> int:
        cpu = next(iter(snapshot.values()))
        return int(cpu["Total"] - cpu.get(kinds.PARAM, 0) - cpu.get(kinds.GRAD, 0) - cpu.get(kinds.BUFFER, 0))

    with sharding.attention() if sharding is not None else contextlib.nullcontext():
        h = x
        for block in blocks:
            h = checkpoint(block, h) if checkpointed else block(h)
    saved = without_weights(tracker.get_tracker_snapshot("current"))
    h.sum().backward()
    return saved, without_weights(tracker.get_tracker_snapshot("peak"))


def run(ranks: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """A torchrun of ``ranks`` gloo processes running :func:`worker`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        forwarded = ["--dim", str(args.dim), "--heads", str(args.heads), "--blocks", str(args.blocks),
                     "--lengths", *map(str, args.lengths), "--out", str(out), "--worker"]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--standalone",
               "-m", "benchmarks.context_memory", *forwarded]  # fmt: skip
        subprocess.run(cmd, check=True, env=env, cwd=ROOT)
        rows: list[dict[str, Any]] = json.loads(out.read_text())
        return rows


def report(rows: list[dict[str, Any]], budget_mib: float | None, args: argparse.Namespace) -> str:
    """The Markdown tables: peak and saved memory per length, and the longest sequence in the budget."""
    configs = sorted({(r["ranks"], r["checkpointing"]) for r in rows})
    name = {c: f"{c[0]} rank{'s' * (c[0] > 1)}{', ckpt' if c[1] else ''}" for c in configs}
    cell = {(r["ranks"], r["checkpointing"], r["length"]): r for r in rows}
    lines = [
        f"{args.blocks} GPT blocks (hidden {args.dim}, {args.heads} heads, batch 1, causal), fp32, one forward + "
        "backward; MiB per rank (largest over the ranks); activations and temporaries, weights and gradients left out.",
        "",
        "| tokens | " + " | ".join(f"{name[c]}: peak (per block) / saved per block" for c in configs) + " |",
        "|---:|" + "---:|" * len(configs),
    ]
    for length in sorted({r["length"] for r in rows}):
        values = []
        for c in configs:
            r = cell.get((*c, length))
            values.append("–" if r is None else _cell(r, args.blocks))
        lines.append(f"| {length} | " + " | ".join(values) + " |")
    if budget_mib is None:
        base = cell.get((1, False, 4096))
        budget_mib = base["peak_mib"] if base else max(r["peak_mib"] for r in rows)
    lines += ["", f"Longest measured sequence whose peak fits in {budget_mib:.0f} MiB per rank:", "",
              "| configuration | tokens |", "|---|---:|"]  # fmt: skip
    for c in configs:
        fitting = [r["length"] for r in rows if (r["ranks"], r["checkpointing"]) == c and r["peak_mib"] <= budget_mib]
        lines.append(f"| {name[c]} | {max(fitting) if fitting else '–'} |")
    return "\n".join(lines)


def _cell(row: dict[str, Any], blocks: int) -> str:
    return f"{row['peak_mib']:.1f} ({row['peak_mib'] / blocks:.1f}) / {row['saved_per_block_mib']:.1f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--budget-mib", type=float, default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--tables", metavar="JSON", help="print the tables of an earlier run's results file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return
    if args.tables:
        saved = json.loads(Path(args.tables).read_text())
        measured = argparse.Namespace(**{**saved["args"], "budget_mib": args.budget_mib})
        print(report(saved["rows"], args.budget_mib, measured))
        return
    rows = [row for ranks in args.ranks for row in run(ranks, args)]
    table = report(rows, args.budget_mib, args)
    print(table)
    stem = RESULTS / f"{dt.date.today().isoformat()}-context-memory"
    stem.with_suffix(".json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    stem.with_suffix(".md").write_text(table + "\n")


if __name__ == "__main__":
    main()
